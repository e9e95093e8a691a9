"""Scripted engine steps for driving a real vLLM scheduler in-process."""

from __future__ import annotations

import collections
import zlib

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from tidal_workers.bench.virtual import BLOCK_SIZE
from tidal_workers.bench.virtual import model_output
from tidal_workers.bench.virtual import new_request

__all__ = ["BLOCK_SIZE", "ScheduleAhead", "make_request", "run_step", "runner_output"]


def make_request(request_id: str, prompt: list[int] | int, priority: int, max_tokens: int = 8) -> Request:
    """A request as the engine core builds it; ``prompt`` is token ids or a length."""
    tokens = (
        prompt if isinstance(prompt, list) else [(zlib.crc32(request_id.encode()) + i) % 250 for i in range(prompt)]
    )
    return new_request(request_id, tokens, priority, max_tokens)


def runner_output(scheduler: Scheduler, output: SchedulerOutput) -> ModelRunnerOutput:
    """The model runner's answer to a step (``virtual.model_output``)."""
    return model_output(scheduler, output)


def run_step(scheduler: Scheduler) -> SchedulerOutput:
    """One synchronous engine step with the model runner scripted."""
    output = scheduler.schedule()
    scheduler.update_from_output(output, runner_output(scheduler, output))
    return output


class ScheduleAhead:
    """The engine core under async scheduling (``step_with_batch_queue``, a queue of two): step N+1 is scheduled
    before step N's output is fed back."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.in_flight: collections.deque[tuple[SchedulerOutput, ModelRunnerOutput]] = collections.deque()

    def schedule(self) -> SchedulerOutput:
        output = self.scheduler.schedule()
        self.in_flight.append((output, runner_output(self.scheduler, output)))
        return output

    def feed(self) -> SchedulerOutput:
        """Feed back the oldest step's output; return that step."""
        output, runner = self.in_flight.popleft()
        self.scheduler.update_from_output(output, runner)
        return output

    def step(self) -> SchedulerOutput:
        """Schedule the next step, then feed back the one before it; return the step just scheduled."""
        output = self.schedule()
        if len(self.in_flight) == 2:
            self.feed()
        return output

    def drain(self) -> None:
        while self.in_flight:
            self.feed()
