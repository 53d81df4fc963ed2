"""A list-scheduling model of the causal convoy order (`kernels._flash_bwd_fused_hopper.ordered_convoy`),
no GPU: how far apart two programs of a key head read the same query tile, and how busy the SMs stay.

Each of `slots` SMs runs one program at a time; programs start in launch order as slots free up. Program
j of a key head (keys j*128 ..) walks query tiles j .. tiles-1, one step a tile, and may not add into tile
i before program j+1 has (plus `latency` steps): the causal convoy's order. A model tile is 128 queries,
as many as a program's keys (the kernel steps 64 query rows at a time, two steps a model tile), and
every step costs the same. With `--descending` each
program walks its tiles from the last instead (an order not tried on the GPU).

    python benchmarks/model_convoy_schedule.py --tiles 128 256 384 512

prints per length the model's efficiency (work / (slots x makespan)) and the median, 90th and 99th
percentile of the steps between two programs' reads of one tile. NOTES_attention.md, session 49, cites
its default run: medians 1.4 / 2.0 / 2.6 / 3.3 steps at 16k / 32k / 48k / 64k (128-query tiles).
"""

from __future__ import annotations

import argparse
import heapq


def simulate(tiles: int, heads: int, slots: int, latency: float, descending: bool) -> dict:
    """The model's efficiency and reuse distances for one length (`tiles` query tiles a head)."""
    order = [(h, j) for h in range(heads) for j in reversed(range(tiles))]  # a head's last keys first
    finished = {}  # (head, program) -> {tile: step its add completed}
    last_read = {}  # (head, tile) -> step of the latest read
    distances = []
    free = [0.0] * slots
    end = 0.0
    for head, program in order:
        t = heapq.heappop(free)
        before = finished.get((head, program + 1), {})
        done = {}
        walk = range(tiles - 1, program - 1, -1) if descending else range(program, tiles)
        for tile in walk:
            if tile in before:
                t = max(t, before[tile] + latency)
            if (head, tile) in last_read:
                distances.append(t - last_read[head, tile])
            last_read[head, tile] = t
            t += 1.0
            done[tile] = t
        finished[head, program] = done
        finished.pop((head, program + 2), None)
        heapq.heappush(free, t)
        end = max(end, t)
    distances.sort()
    at = lambda q: round(distances[int(q * len(distances))], 1)  # noqa: E731
    work = heads * tiles * (tiles + 1) / 2
    return dict(
        tiles=tiles, efficiency=round(work / (slots * end), 3), median=at(0.5), p90=at(0.9), p99=at(0.99)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, nargs="+", default=[128, 256, 384, 512])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--slots", type=int, default=132, help="SMs (one program each)")
    parser.add_argument("--latency", type=float, default=0.3, help="an add's hand-over, in steps")
    parser.add_argument("--descending", action="store_true")
    args = parser.parse_args()
    for tiles in args.tiles:
        print(simulate(tiles, args.heads, args.slots, args.latency, args.descending), flush=True)


if __name__ == "__main__":
    main()
