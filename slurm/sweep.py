"""Expand a Hydra sweep into its members, exactly as `python train.py -m <overrides>` would, so that a
Slurm job array can run one member per task (slurm/launch.sh calls this with SWEEP and the task id).

    python slurm/sweep.py --count +sweep=lr trainer.max_steps=2000   # number of members: submit --array=0-(N-1)
    python slurm/sweep.py --task 2 +sweep=lr trainer.max_steps=2000  # member 2's overrides, one line

A sweep is the sweep parameters of the composed config (`hydra.sweeper.params`, e.g. configs/sweep/lr.yaml)
followed by the command line's own, in the order of Hydra's basic sweeper.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def sweep_members(overrides: list[str]) -> list[list[str]]:
    """Every member of the sweep, each a list of plain overrides."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from flashtrain.config import register_configs

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    # The config is composed without the swept values (compose takes one value per key) only to read
    # the sweep parameters that config files add.
    register_configs()
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=plain, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    from_config = [f"{key}={value}" for key, value in params.items()]
    batches = BasicSweeper.split_arguments(
        parser.parse_overrides(from_config + overrides), max_batch_size=None
    )
    return [list(member) for batch in batches for member in batch]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--count", action="store_true", help="print the number of members")
    which.add_argument("--task", type=int, help="print the overrides of this member (0-based array task id)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, sweeps written as for `train.py -m`")
    args = ap.parse_args(argv)
    members = sweep_members(args.overrides)
    if args.count:
        print(len(members))
        return 0
    if not 0 <= args.task < len(members):
        print(
            f"slurm/sweep.py: array task {args.task} but the sweep has {len(members)} members; "
            f"submit with sbatch --array=0-{len(members) - 1}",
            file=sys.stderr,
        )
        return 1
    print(" ".join(members[args.task]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
