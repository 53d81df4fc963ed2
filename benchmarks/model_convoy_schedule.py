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

With `--schemes`, a step-by-step model instead (session 50), in which a program may also wait on one
launched after it: a step takes `--step-ticks` ticks, an add waits until the tile's previous adder's add
is `--latency-ticks` old. Schemes: `blocks:B`, a key head's programs in blocks of B key tiles, the last
block first, each block's in order (`kernels._flash_bwd_fused_hopper.causal_convoy_block`; blocks:1 is the
order above), `ascending`, a key head's programs launched in grid order (heaviest first) with each tile's
adds in ascending program order, so program j waits on program j - 1, launched before it (session 51), and
`unordered`, the unordered kernel's heaviest-first order over chunks of 3 heads with no waits. Per scheme it prints the efficiency and the share of tile reads that find the tile among the last
C distinct tiles read (an LRU cache of C tiles of 128 queries: Q, dO and the fp32 dq, 128 KB each):

    python benchmarks/model_convoy_schedule.py --tiles 256 384 512 --schemes blocks:1 blocks:16 unordered

Session 50 cites it (NOTES_attention.md, "The causal convoy's L2, and launch blocks"). A scheme prefixed
`down:` (e.g. `down:blocks:1`) walks each program's tiles from the last down to its diagonal's instead
(`kernels._flash_bwd_fused_hopper.causal_convoy_walks_down`); session 51 cites `ascending` and
`down:blocks:1` (NOTES_attention.md, "The causal convoy walking down"). Session 54 added `ascending:G`
(`ascending` with runs of G heads, their programs round robin) and `groups:G` (a key head's programs in G
key groups, each adding into its own dq buffer and waiting only within it, the heaviest group launched
first, each group's last keys first: `kernels._flash_bwd_fused_hopper.ordered_dq_groups`), and
`--heads 8` for a model's heads of 128 (NOTES_attention.md, "Causal calls in two key groups").
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


def group_size(scheme: str, tiles: int) -> int:
    """Key tiles a key group of `groups:G` holds (the last group may hold fewer); other schemes: all."""
    if not scheme.startswith("groups:"):
        return tiles
    return -(-tiles // int(scheme.removeprefix("groups:")))


def launch_order(scheme: str, heads: int, tiles: int) -> list[tuple[int, int]]:
    """(head, program) in launch order: `blocks:B`, `ascending`, `ascending:G`, `groups:G` or `unordered` (see
    the module's text)."""
    if scheme == "ascending":
        return [(h, j) for h in range(heads) for j in range(tiles)]
    if scheme.startswith("ascending:"):  # runs of G heads, their programs round robin, heaviest first
        g = int(scheme.removeprefix("ascending:"))
        return [
            (h, j)
            for first in range(0, heads, g)
            for j in range(tiles)
            for h in range(first, min(first + g, heads))
        ]
    if scheme == "unordered":
        return [
            (h, j)
            for first in range(0, heads, 3)
            for j in range(tiles)
            for h in range(first, min(first + 3, heads))
        ]
    if scheme.startswith("groups:"):  # G key groups, the heaviest first, each last keys first
        per_group = group_size(scheme, tiles)
        firsts = range(0, tiles, per_group)
        return [
            (h, j)
            for h in range(heads)
            for f in firsts
            for j in reversed(range(f, min(f + per_group, tiles)))
        ]
    block = int(scheme.removeprefix("blocks:"))
    starts = list(reversed(range(0, tiles, block)))
    return [(h, j) for h in range(heads) for first in starts for j in range(first, min(first + block, tiles))]


def simulate_steps(tiles: int, heads: int, slots: int, step_ticks: int, latency_ticks: int, scheme: str):
    """(efficiency, reads): the step-by-step model's work / (slots x makespan) and every tile read as
    (tick, head, tile). Program j adds into tile i once its step there is done and program j + 1's add
    there (if it sees the tile) is latency_ticks old (`ascending`: program j - 1's, which sees every tile
    program j does); `unordered` never waits."""
    walk_down = scheme.startswith("down:")  # (each program walks its tiles from the last one down)
    scheme = scheme.removeprefix("down:")
    ascending = scheme.startswith("ascending")
    order = launch_order(scheme, heads, tiles)
    # (groups:G: each key group adds into its own dq buffer, so a program waits only within its group)
    per_group = group_size(scheme, tiles)
    added = {}  # (head, program) -> {tile: tick of its add}
    running, reads, launched, now = [], [], 0, 0
    while launched < len(order) or running:
        while len(running) < slots and launched < len(order):
            head, program = order[launched]
            launched += 1
            added[head, program] = {}
            first = tiles - 1 if walk_down else program
            running.append([head, program, first, now + step_ticks])
            reads.append((now, head, first))
        still = []
        for r in running:
            head, program, tile, ready = r
            # the tile's adder before this program: program j - 1 (ascending), which sees every tile j
            # does, or j + 1, which sees tiles i >= j + 1; its add there may not have happened, or it not
            # started
            waits = False
            previous = program - 1 if ascending else program + 1
            sees = 0 <= previous if ascending else previous < tiles and tile > program
            sees = sees and previous // per_group == program // per_group
            if scheme != "unordered" and sees:
                before = added.get((head, previous), {})
                waits = tile not in before or before[tile] + latency_ticks > now
            if now >= ready and not waits:
                added[head, program][tile] = now
                following = tile - 1 if walk_down else tile + 1
                if (following >= program) if walk_down else (following < tiles):
                    r[2:] = [following, now + step_ticks]
                    reads.append((now, head, following))
                    still.append(r)
                continue
            still.append(r)
        running = still
        now += 1
    work = heads * tiles * (tiles + 1) / 2 * step_ticks
    return work / (slots * now), reads


def lru_distances(reads: list[tuple]) -> list[int]:
    """For every read of a (head, tile) read before: how many distinct tiles were read since (reads in
    time order; a Fenwick tree over the latest read of each tile)."""
    reads = sorted(reads)
    tree = [0] * (len(reads) + 1)

    def add(i, v):
        i += 1
        while i < len(tree):
            tree[i] += v
            i += i & -i

    def prefix(i):  # marks at positions 0 .. i
        total, i = 0, i + 1
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    latest, distances = {}, []
    for pos, (_, head, tile) in enumerate(reads):
        before = latest.get((head, tile))
        if before is not None:
            distances.append(prefix(pos - 1) - prefix(before))
            add(before, -1)
        add(pos, 1)
        latest[head, tile] = pos
    return distances


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiles", type=int, nargs="+", default=[128, 256, 384, 512])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--slots", type=int, default=132, help="SMs (one program each)")
    parser.add_argument("--latency", type=float, default=0.3, help="an add's hand-over, in steps")
    parser.add_argument("--descending", action="store_true")
    parser.add_argument("--schemes", nargs="+", default=None, help="the step-by-step model's launch schemes")
    parser.add_argument("--step-ticks", type=int, default=2)
    parser.add_argument("--latency-ticks", type=int, default=2)
    parser.add_argument("--cache-tiles", type=int, nargs="+", default=[200, 300, 400])
    args = parser.parse_args()
    for tiles in args.tiles:
        if not args.schemes:
            print(simulate(tiles, args.heads, args.slots, args.latency, args.descending), flush=True)
        for scheme in args.schemes or ():
            efficiency, reads = simulate_steps(
                tiles, args.heads, args.slots, args.step_ticks, args.latency_ticks, scheme
            )
            distances = lru_distances(reads)
            hits = {c: round(sum(d < c for d in distances) / len(reads), 3) for c in args.cache_tiles}
            print(
                dict(tiles=tiles, scheme=scheme, efficiency=round(efficiency, 3), lru_hits=hits), flush=True
            )


if __name__ == "__main__":
    main()
