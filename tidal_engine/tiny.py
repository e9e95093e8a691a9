"""Tiny random-weight Qwen2-style models that vLLM serves on a CPU in seconds.

No model hub is reachable from CI, so tests and the local benchmark use models
built here: random seeded weights, head size 32 (a size vLLM's CPU attention
supports), a byte-level tokenizer that never needs training and a ChatML chat
template. Their text is noise; their timing, KV use and scheduling are those of
a real transformer served by the real engine. Three shapes (``SHAPES``):

- ``tiny`` (2 layers, hidden 128): the fastest engine to start and run. Its
  step costs the same few milliseconds whatever it carries, so the engine is
  bound by its step count, as a GPU never is.
- ``dense`` (2 layers, hidden 384): a step's time grows with its tokens
  (a 1,024-token prefill takes about 30× a 16-token decode step on one core),
  as on a GPU, so a batch prefill really does delay the online tokens that
  share its step. TidalScheduler's latency model and batch cap act on that.
- ``twin`` (1 layer, hidden 64, one KV head): the timed twin's model
  (``twin_model.py``), whose steps are paced to a GPU profile's time.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import shutil
import typing as t
from pathlib import Path

if t.TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast
    from transformers import Qwen2ForCausalLM

SEED = 1234
HEAD_DIM = 32
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Bump when the recipe changes so cached copies are rebuilt.
RECIPE_VERSION = "1"


@dataclasses.dataclass(frozen=True)
class Shape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    architecture: str = "Qwen2ForCausalLM"
    max_position_embeddings: int = 4096


SHAPES = {
    "tiny": Shape(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    # The same KV bytes per token as tiny (2 layers x 2 KV heads x 32), so every KV size carries over.
    "dense": Shape(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=12, num_key_value_heads=2
    ),
    # The timed twin's model (twin_model.py): the smallest vLLM serves (one layer, one KV head of 32: 256 bytes
    # of float32 KV per token, so a GPU's pool of millions of tokens fits), with a long context.
    "twin": Shape(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        architecture="TidalTwinForCausalLM",
        max_position_embeddings=32768,
    ),
}


def model_dir(home: str | Path, shape: str = "tiny") -> Path:
    return Path(home) / "models" / shape


def kv_bytes_per_token(shape: str) -> int:
    """float32 K and V of every layer's KV heads (head size 32)."""
    s = SHAPES[shape]
    return 2 * s.num_hidden_layers * s.num_key_value_heads * HEAD_DIM * 4


def _tokenizer(max_length: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # Byte-level BPE over the 256 byte symbols with no merges: every text
    # encodes, one token per byte, and nothing is ever unknown.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_length,
    )


def _model(shape: Shape, vocab_size: int, special_ids: list[int]) -> Qwen2ForCausalLM:
    import torch
    from transformers import Qwen2Config
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=special_ids[0],
        eos_token_id=special_ids[2],
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # A random model stops at random; wide output weights with the special
        # tokens' rows zeroed keep it generating ordinary bytes.
        model.lm_head.weight.mul_(8.0)
        model.lm_head.weight[special_ids] = 0.0
    return model


def build_tiny(home: str | Path, shape: str = "tiny") -> Path:
    """Build the model under ``<home>/models/<shape>`` unless a complete copy exists; return its path."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; one of {', '.join(SHAPES)}")
    target = model_dir(home, shape)
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Two processes may want the same model at once (tests/run.sh runs its soaks beside the main pass): the
    # second waits for the first's build instead of deleting it mid-write.
    with open(target.with_name(f"{shape}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _complete(target):
            _build(target, shape)
    return target


def _complete(target: Path) -> bool:
    stamp = target / "tidal-tiny.json"
    return stamp.exists() and json.loads(stamp.read_text()).get("recipe") == RECIPE_VERSION


def _build(target: Path, shape: str) -> None:
    work = target.with_name(f"{shape}.partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = SHAPES[shape]
    tokenizer = _tokenizer(spec.max_position_embeddings)
    special_ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    _model(spec, len(tokenizer), special_ids).save_pretrained(work, safe_serialization=True)
    if spec.architecture != "Qwen2ForCausalLM":
        # save_pretrained names the class that saved it; vLLM picks the model class by this name.
        config_path = work / "config.json"
        config_path.write_text(
            json.dumps({**json.loads(config_path.read_text()), "architectures": [spec.architecture]})
        )
    tokenizer.save_pretrained(work)
    # vLLM takes default sampling parameters from this file: keep them neutral.
    (work / "generation_config.json").write_text(
        json.dumps({"bos_token_id": special_ids[0], "eos_token_id": special_ids[2], "do_sample": True})
    )
    (work / "tidal-tiny.json").write_text(json.dumps({"recipe": RECIPE_VERSION, "seed": SEED, "shape": shape}))
    shutil.rmtree(target, ignore_errors=True)
    work.rename(target)  # atomic: a crashed build never looks complete
