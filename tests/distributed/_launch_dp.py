"""Data-parallel runs inside one torchrun job (process start-up costs seconds; one job serves many cases).

    torchrun --nproc_per_node=2 tests/distributed/_launch_dp.py OUT.json CASES.json

CASES.json is a list of {"name", "overrides", "resume_overrides" (optional)}. For each case this runs the
trainer straight to `trainer.max_steps` (run `<name>`), then again in run `<name>-killed` stopped after
step 3 (it checkpoints every 2 steps), then resumes that run from its step-2 checkpoint with
`resume_overrides` added (another strategy, for cross-strategy resume). Rank 0 writes
{name: {"straight": losses, "resumed": losses, "run_dir": ...}} to OUT.json; weights are read back from
the checkpoints by the test.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from flashtrain.config import compose_config  # noqa: E402
from flashtrain.trainer import Trainer  # noqa: E402


class KilledError(Exception):
    """Stands in for SIGKILL between two steps (raised on every rank at the same step)."""


def _kill_after(step_to_die: int):
    def hook(_, step):
        if step == step_to_die:
            raise KilledError

    return hook


def run_case(case: dict) -> dict:
    name, overrides = case["name"], case["overrides"]
    straight = Trainer(compose_config([*overrides, f"trainer.run_name={name}"]))
    history = straight.fit()
    straight.strategy.release()
    killed = Trainer(compose_config([*overrides, f"trainer.run_name={name}-killed"]))
    killed.step_hooks.append(_kill_after(3))
    try:
        killed.fit()
        raise AssertionError("the killed run was not killed")
    except KilledError:
        pass
    killed.strategy.release()
    resume_overrides = case.get("resume_overrides", [])
    resumed = Trainer(
        compose_config(
            [*overrides, *resume_overrides, f"trainer.run_name={name}-killed", "trainer.resume=true"]
        )
    )
    resumed_history = resumed.fit()
    resumed.strategy.release()
    return {"straight": history, "resumed": resumed_history, "run_dir": straight.run_dir}


def main() -> None:
    out_path, cases_path = sys.argv[1], sys.argv[2]
    with open(cases_path) as f:
        cases = json.load(f)
    torch.set_num_threads(1)  # the ranks share the machine's cores
    results = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case)
        # reported per case; a failure on one rank only would hang the job until the test's deadline
        except Exception:
            results[case["name"]] = {"error": traceback.format_exc()}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    if dist.is_initialized():
        # The trainers released their models (not Trainer.close: the next case's trainer needs this
        # process group; torchrun's store cannot host a second one), so destroying the group joins
        # its threads before interpreter shutdown.
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
