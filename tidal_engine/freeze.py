"""TidalFreezeConnector: vLLM's example KV connector, narrowed to what phase-split freeze / thaw needs.

vLLM's ``ExampleConnector`` writes every request's prompt KV (online ones too) to one folder per prompt hash, and
for a prompt longer than τ it stores the first prefill chunk under the whole prompt's name, so thawing it kills
the engine core (docs/engine.md, KV connectors). This subclass changes three things and keeps its file format:

- only requests tagged ``kv_transfer_params: {"tidal_freeze": "<batch id>"}`` are frozen or thawed; others pass
  through untouched;
- a tagged request's files go under ``<shared_storage_path>/<batch id>/<prompt hash>/``, so a batch's frozen KV
  is one folder: its size is ``du`` of it and ending the batch deletes it;
- a prompt is frozen only when its whole prefill is scheduled in one step; a chunked one is not frozen at all, so
  its decode phase recomputes it instead of thawing a truncated KV.

Load it with the flags ``tidal_engine.serve.freeze_connector_args(DIR)`` returns (``--kv-transfer-config`` naming
this class and ``shared_storage_path`` DIR).
"""

from __future__ import annotations

import os
import re
import typing as t

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnectorMetadata
from vllm.utils.hashing import safe_hash

if t.TYPE_CHECKING:
    import torch
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

TAG = "tidal_freeze"  # the key in a request's kv_transfer_params; its value names the batch
_MARK = "tidal-batch:"  # carried in ReqMeta.mm_hashes from the scheduler to the worker process
_SAFE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # a batch id as a folder name: no separators, no traversal


def tagged_batch(kv_transfer_params: object) -> str | None:
    """The batch a request freezes for, or None (an online request, or a tag that cannot name a folder)."""
    batch = kv_transfer_params.get(TAG) if isinstance(kv_transfer_params, dict) else None
    return batch if isinstance(batch, str) and _SAFE.match(batch) and batch not in (".", "..") else None


class TidalFreezeConnector(ExampleConnector):
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if tagged_batch(request.kv_transfer_params) is None:
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def _found_match_for_request(self, request: Request) -> bool:
        batch = tagged_batch(request.kv_transfer_params)
        return batch is not None and self._found_match_for_prompt(list(request.prompt_token_ids or []), [_MARK + batch])

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> ExampleConnectorMetadata:
        """Load what is thawed this step; store tagged prompts whose whole prefill runs in this step."""
        meta = ExampleConnectorMetadata()
        for new_req in scheduler_output.scheduled_new_reqs:
            prompt = new_req.prompt_token_ids or []
            loading = self._requests_need_load.pop(new_req.req_id, None)
            if loading is not None:  # matched by get_num_new_matched_tokens, so tagged
                batch = tagged_batch(loading.kv_transfer_params)
                meta.add_request(prompt, new_req.block_ids[0], self._block_size, False, [_MARK + str(batch)])
                continue
            extra = new_req.sampling_params.extra_args if new_req.sampling_params else None
            batch = tagged_batch((extra or {}).get("kv_transfer_params"))
            if batch is None:
                continue
            scheduled = scheduler_output.num_scheduled_tokens[new_req.req_id]
            whole = new_req.num_computed_tokens + scheduled >= len(prompt)
            if whole and not self._found_match_for_prompt(prompt, [_MARK + batch]):
                meta.add_request(prompt, new_req.block_ids[0], self._block_size, True, [_MARK + batch])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            # A thawed request preempted before its first step resumes with blocks that expect the load (as in
            # the parent class).
            request = self._requests_need_load.pop(req_id, None)
            new_block_ids = cached.new_block_ids[i]
            if request is None or req_id not in cached.resumed_req_ids or new_block_ids is None:
                continue
            total = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            batch = tagged_batch(request.kv_transfer_params)
            meta.add_request(
                request.all_token_ids[:total], new_block_ids[0], self._block_size, False, [_MARK + str(batch)]
            )
        self._requests_need_load.clear()
        return meta

    def _generate_foldername_debug(
        self, token_ids: torch.Tensor, mm_hashes: list[str], create_folder: bool = False
    ) -> str:
        """``<path>/<batch>/<hash of the prompt's tokens>`` for a tagged request (the parent's name otherwise)."""
        batches = [h[len(_MARK) :] for h in mm_hashes if h.startswith(_MARK)]
        if not batches:
            return super()._generate_foldername_debug(token_ids, mm_hashes, create_folder)
        digest = safe_hash(token_ids.numpy().tobytes(), usedforsecurity=False).hexdigest()
        folder = os.path.join(self._storage_path, batches[0], digest)
        if create_folder:
            os.makedirs(folder, exist_ok=True)
        return folder
