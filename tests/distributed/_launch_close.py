"""Trainer.close() under torchrun: after it, no gloo thread may be left running.

    torchrun --nproc_per_node=2 tests/distributed/_launch_close.py OUT_PREFIX OVERRIDE...

Trains with the overrides and closes the trainer; each rank writes OUT_PREFIX.<rank>.json: the names
of the gloo threads alive after close, and how many GPT modules are still alive. One run per job: torchrun's store cannot host a second default
process group after the first is destroyed (the second one's ranks find stale addresses). A gloo thread that
outlives close() runs into interpreter shutdown, where it can abort the process after the last
checkpoint (SIGABRT, "terminate called without an active exception").
"""

from __future__ import annotations

import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from flashtrain.config import compose_config  # noqa: E402
from flashtrain.models.gpt import GPT  # noqa: E402
from flashtrain.trainer import Trainer  # noqa: E402
from tests.distributed.launcher import gloo_threads  # noqa: E402


def main() -> None:
    out_prefix, overrides = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)  # the ranks share the machine's cores
    trainer = Trainer(compose_config(overrides))
    try:
        trainer.fit()
    finally:
        trainer.close()
    gc.collect()
    live_models = sum(isinstance(obj, GPT) for obj in gc.get_objects())
    with open(f"{out_prefix}.{os.environ['RANK']}.json", "w") as f:
        json.dump({"gloo_threads": gloo_threads(), "live_models": live_models}, f)


if __name__ == "__main__":
    main()
