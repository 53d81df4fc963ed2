"""Pathfinder images (Linsley et al. 2018) with the parameters Long Range Arena used per resolution.

An image holds two target paths and a few short distractor paths. Every path is a chain of straight dashes
("paddles"); each next dash starts one margin ahead of the last one's end, turned by an angle drawn with
weight cos^2(min(|dtheta| * continuity, pi/2)). The second target path starts `seed_distance` from the
start of the first. Two filled circles mark the start of one target path and the end of either the same
path (label 1) or the other one (label 0).

Differences from Linsley's code, for speed and for a checkable label: paths are grown one after another
(first target, second target, distractors) with a depth-first search that takes back dashes when stuck;
orientations are whole degrees and dash starts are rounded to 1/4 pixel (so dash shapes can be cached);
a distractor that cannot be placed after 20 tries is left out; the gap between dashes is one margin.

Everything is drawn at `antialias` times the resolution and box-filtered down, so the edges are
anti-aliased. Placement is checked on the output pixels, which gives the invariant the tests rely on:
with `link = params.link_distance`,
  * consecutive dashes of a path (and a marker and its dash) come within Chebyshev distance `link`;
  * pixels of two different paths are more than `link` apart, markers and unmarked path ends included.
So in the final image the two markers are joined by a chain of non-zero pixels with steps of at most `link`
exactly when the label is 1.

Image `i` of a split is a function of `(seed, split, i)` alone, so any number of worker processes, or
regenerating only part of a split, gives the same pixels.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from data.lra._checks import check_int

__all__ = [
    "LRA_PARAMS",
    "PathfinderParams",
    "PathfinderSample",
    "generate",
    "params_for",
    "render",
    "sample",
]


@dataclass(frozen=True)
class PathfinderParams:
    """How one Pathfinder image is drawn. Lengths are in output pixels."""

    resolution: int  # side H of the square canvas
    padding: int  # nothing is drawn closer than this to a border
    seed_distance: float  # distance between the start points of the two target paths
    marker_radius: float  # radius of the two filled circles
    paddle_length: float  # length of one dash
    paddle_thickness: float  # width of one dash
    margins: tuple[float, ...]  # gap between consecutive dashes of a path; one is drawn per image
    continuity: float  # turn weight cos^2(min(|dtheta| * continuity, pi/2)): larger means straighter paths
    num_distractors: int  # distractor paths tried per image (one that cannot be placed is left out)
    distractor_length: int  # dashes per distractor path
    path_contrast: float  # intensity multiplier of a whole path
    paddle_contrast: float  # intensity multiplier of one dash (product clipped to 1)
    contour_length: int = 14  # dashes per target path
    antialias: int = 2  # supersampling factor of the renderer
    max_attempts: int = 500  # fresh layouts tried for one image before the parameters are declared unusable

    def __post_init__(self):
        def need(ok: bool, what: str):
            if not ok:
                raise ValueError(f"PathfinderParams: {what} (got {self})")

        need(isinstance(self.resolution, int) and self.resolution >= 8, "resolution must be an int >= 8")
        need(0 <= self.padding < self.resolution // 2, "padding must be in [0, resolution // 2)")
        need(self.paddle_length > 0 and self.paddle_thickness > 0, "paddle length and thickness must be > 0")
        need(self.marker_radius > 0, "marker_radius must be > 0")
        need(
            len(self.margins) > 0 and all(m >= 0 for m in self.margins), "margins must be >= 0, at least one"
        )
        need(self.continuity > 0.5, "continuity must be > 0.5 (turns reach pi / (2 * continuity))")
        need(self.contour_length >= 2, "contour_length must be >= 2 dashes")
        need(self.distractor_length >= 1, "distractor_length must be >= 1 dash")
        need(self.num_distractors >= 0, "num_distractors must be >= 0")
        need(self.path_contrast > 0 and self.paddle_contrast > 0, "contrasts must be > 0")
        need(isinstance(self.antialias, int) and self.antialias >= 1, "antialias must be an int >= 1")
        need(self.max_attempts >= 1, "max_attempts must be >= 1")
        lo, hi = self._seed_box()
        need(lo <= hi, "seed_distance + marker_radius + padding must leave room for the first target path")

    @property
    def link_distance(self) -> int:
        """Largest Chebyshev step, in pixels, between consecutive dashes of one path."""
        return math.ceil(max(self.margins)) + 1

    def _seed_box(self) -> tuple[float, float]:
        # The first target path starts far enough inside that the second one, seed_distance away in any
        # direction, still starts on the canvas with its marker.
        reach = self.padding + self.seed_distance + self.marker_radius
        return reach, self.resolution - reach


def _lra(resolution, padding, seed_distance, marker_radius, paddle_length, thickness, margins, continuity,
         num_distractors, path_contrast, paddle_contrast):  # fmt: skip
    return PathfinderParams(
        resolution=resolution,
        padding=padding,
        seed_distance=seed_distance,
        marker_radius=marker_radius,
        paddle_length=paddle_length,
        paddle_thickness=thickness,
        margins=margins,
        continuity=continuity,
        num_distractors=num_distractors,
        distractor_length=4,
        path_contrast=path_contrast,
        paddle_contrast=paddle_contrast,
    )


# Long Range Arena's settings (Pathfinder-32/64, Path-X = 128, Path-256); contour length 14, antialias x2.
LRA_PARAMS: dict[int, PathfinderParams] = {
    32: _lra(32, 1, 7, 1.5, 2, 0.5, (1.0,), 1.0, 5, 2.0, 0.75),
    64: _lra(64, 1, 12, 2.5, 5, 1.0, (1.0,), 1.8, 5, 0.8, 1.0),
    128: _lra(128, 1, 20, 3, 5, 1.5, (2.0, 3.0), 1.8, 8, 0.9, 1.0),
    256: _lra(256, 22, 27, 5, 5, 2.0, (3.0,), 1.8, 7, 1.0, 1.0),
}


def params_for(resolution: int) -> PathfinderParams:
    if resolution not in LRA_PARAMS:
        raise ValueError(
            f"no Long Range Arena Pathfinder parameters for resolution {resolution}; use one of "
            f"{sorted(LRA_PARAMS)} or pass params=PathfinderParams(...)"
        )
    return LRA_PARAMS[resolution]


@dataclass
class PathfinderSample:
    image: np.ndarray  # (H, H) uint8
    label: int  # 1 when both markers sit on the same path
    markers: tuple[tuple[float, float], tuple[float, float]]  # (y, x) centres of the two circles
    num_distractors: int  # distractor paths actually drawn


# ---------------------------------------------------------------------------------------------------------
# rasterisation

# Orientations are whole degrees and dash start points are rounded to 1/4 pixel, so the few
# thousand distinct dash shapes of a parameter set are rasterised once per process and then looked up.
_ANGLES = 360
_SUBPIXEL = 4
# Points are (y, x) tuples of floats: the hot loop tries ~1000 dashes per image, and numpy's per-call
# overhead on 2-vectors would dominate it.
_UNIT = [(math.sin(a * 2 * math.pi / _ANGLES), math.cos(a * 2 * math.pi / _ANGLES)) for a in range(_ANGLES)]
_FREE = np.iinfo(np.int16).max


def _unit(angle: int) -> tuple[float, float]:
    return _UNIT[angle % _ANGLES]


def _step(point: tuple[float, float], angle: int, dist: float) -> tuple[float, float]:
    uy, ux = _UNIT[angle % _ANGLES]
    return point[0] + dist * uy, point[1] + dist * ux


def _raster(p0: np.ndarray, p1: np.ndarray, radius: float, aa: int) -> tuple[int, int, np.ndarray]:
    """Coverage of the capsule of `radius` around segment p0-p1 (a disk when p0 == p1).

    Returns (y0, x0, cov): cov is a float32 patch of output pixels whose top-left pixel is (y0, x0).
    A subpixel is inside when its centre lies within radius of the segment; the radius is at least half a
    subpixel so a thin line never breaks into pieces.
    """
    r = max(radius * aa, 0.5 + 1e-6)
    a, b = p0 * aa, p1 * aa  # supersampled coordinates
    y0 = math.floor((min(a[0], b[0]) - r) / aa)
    x0 = math.floor((min(a[1], b[1]) - r) / aa)
    y1 = math.floor((max(a[0], b[0]) + r) / aa) + 1
    x1 = math.floor((max(a[1], b[1]) + r) / aa) + 1
    ys = np.arange(y0 * aa, y1 * aa, dtype=np.float64)[:, None] + 0.5
    xs = np.arange(x0 * aa, x1 * aa, dtype=np.float64)[None, :] + 0.5
    d = b - a
    dd = float(d @ d)
    t = np.clip(((ys - a[0]) * d[0] + (xs - a[1]) * d[1]) / dd, 0.0, 1.0) if dd > 0 else 0.0
    dist2 = (ys - a[0] - t * d[0]) ** 2 + (xs - a[1] - t * d[1]) ** 2
    inside = (dist2 <= r * r).astype(np.float32)
    h, w = y1 - y0, x1 - x0
    cov = inside.reshape(h, aa, w, aa).mean(axis=(1, 3))  # (h*aa, w*aa) -> (h, w) box filter
    return y0, x0, cov


def _dilate(mask: np.ndarray, k: int) -> np.ndarray:
    """Chebyshev dilation by k of a boolean patch; the result is padded by k on every side."""
    h, w = mask.shape
    rows = np.zeros((h + 2 * k, w), dtype=bool)
    for s in range(2 * k + 1):
        rows[s : s + h] |= mask
    out = np.zeros((h + 2 * k, w + 2 * k), dtype=bool)
    for s in range(2 * k + 1):
        out[:, s : s + w] |= rows
    return out


@dataclass(frozen=True)
class _Shape:
    """A rasterised dash or disk; pixel offsets are relative to the integer pixel of its start point."""

    rows: np.ndarray  # support (non-zero) pixels
    cols: np.ndarray
    values: np.ndarray  # coverage there, float32 in (0, 1]
    near_rows: np.ndarray  # pixels within the link distance of the support
    near_cols: np.ndarray
    box: tuple[int, int, int, int]  # min row, max row, min col, max col of the support


@functools.lru_cache(maxsize=1 << 17)
def _shape(length: float, radius: float, aa: int, link: int, angle: int, fy: int, fx: int) -> _Shape:
    start = np.array([fy, fx], dtype=np.float64) / _SUBPIXEL
    y0, x0, cov = _raster(start, start + length * np.array(_unit(angle)), radius, aa)
    sup = cov > 0
    rows, cols = np.nonzero(sup)
    near_rows, near_cols = np.nonzero(_dilate(sup, link))
    rows, cols = rows + y0, cols + x0
    box = (int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max()))
    return _Shape(rows, cols, cov[sup], near_rows + y0 - link, near_cols + x0 - link, box)


def _anchor(point: tuple[float, float]):
    """Round a point to the subpixel grid: (rounded point, integer pixel y, x, subpixel y, x)."""
    qy, qx = round(point[0] * _SUBPIXEL), round(point[1] * _SUBPIXEL)
    iy, fy = divmod(qy, _SUBPIXEL)
    ix, fx = divmod(qx, _SUBPIXEL)
    return (qy / _SUBPIXEL, qx / _SUBPIXEL), iy, ix, fy, fx


class _Canvas:
    """Output-resolution state of one image under construction.

    Paths are grown one at a time. `blocked` marks pixels within the link distance of finished paths;
    `near` holds, per pixel, the lowest tag of the growing path within the link distance, where dash k is
    tagged 2k and a marker disk reserved with it 2k + 1 (so a disk never counts as the link to a dash).
    """

    def __init__(self, p: PathfinderParams):
        self.p = p
        self.link = p.link_distance
        n = p.resolution
        self.image = np.zeros((n, n), np.float32)
        self.blocked = np.zeros((n, n), bool)
        self.near = np.full((n, n), _FREE, np.int16)

    def place(self, pieces, k: int, contrast: float):
        """Put dash k of the growing path down if the rules allow; returns an undo record or None.

        `pieces` are (shape, y, x, drawn): the dash first, then disks that keep room for a marker (part of the
        path, painted later only if the marker is used).
        """
        n, pad = self.p.resolution, self.p.padding
        for shape, iy, ix, _ in pieces:
            r0, r1, c0, c1 = shape.box
            if iy + r0 < pad or ix + c0 < pad or iy + r1 >= n - pad or ix + c1 >= n - pad:
                return None
        for i, (shape, iy, ix, _) in enumerate(pieces):
            rows, cols = shape.rows + iy, shape.cols + ix
            if self.blocked[rows, cols].any():
                return None  # would come within `link` of another path
            near = self.near[rows, cols]
            if (near <= 2 * k - 3).any():
                return None  # would loop back onto its own earlier dashes
            if i == 0 and k > 0 and not (near == 2 * k - 2).any():
                return None  # too far from the previous dash to count as the same path
        record = []
        for i, (shape, iy, ix, drawn) in enumerate(pieces):
            rows, cols = shape.near_rows + iy, shape.near_cols + ix
            inside = (rows >= 0) & (rows < n) & (cols >= 0) & (cols < n)
            rows, cols = rows[inside], cols[inside]
            old_near = self.near[rows, cols]
            self.near[rows, cols] = np.minimum(old_near, 2 * k + (i > 0))
            srows, scols = shape.rows + iy, shape.cols + ix
            old_image = self.image[srows, scols]
            if drawn:
                self.image[srows, scols] = np.maximum(old_image, np.minimum(shape.values * contrast, 1.0))
            record.append((rows, cols, old_near, srows, scols, old_image))
        return record

    def undo(self, record):
        for rows, cols, old_near, srows, scols, old_image in reversed(record):
            self.near[rows, cols] = old_near
            self.image[srows, scols] = old_image

    def finish_path(self):
        self.blocked |= self.near != _FREE
        self.near.fill(_FREE)

    def paint(self, disk):
        shape, iy, ix, _ = disk
        rows, cols = shape.rows + iy, shape.cols + ix
        self.image[rows, cols] = np.maximum(self.image[rows, cols], shape.values)


# ---------------------------------------------------------------------------------------------------------
# paths


class _Path:
    """A chain of dashes; `undo` holds one canvas record per placed dash, in order."""

    def __init__(self, angle: int):
        self.ends = [None]  # end point of each dash, behind a placeholder for "before dash 0"
        self.angles = [angle]
        self.undo = []
        self.markers = {}  # "start" / "end" -> disk piece reserved for a marker

    @property
    def k(self) -> int:
        return len(self.undo)

    @property
    def end(self) -> tuple[float, float]:
        return self.ends[-1]


def _turns(p: PathfinderParams, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Candidate turns (in angle steps) and their weights; about one per subpixel of arc, as in Linsley's code."""
    max_turn = math.pi / (2 * p.continuity)
    arc = (p.paddle_length + margin) * p.antialias
    count = max(9, 2 * math.ceil(max_turn * arc) + 1)
    turns = np.linspace(-max_turn, max_turn, count + 2)[1:-1]  # the end points have weight 0
    steps = np.unique(np.round(turns * _ANGLES / (2 * math.pi)).astype(np.int64))
    weights = np.cos(np.minimum(np.abs(steps * 2 * math.pi / _ANGLES) * p.continuity, math.pi / 2)) ** 2
    keep = weights > 1e-12
    return steps[keep], weights[keep]


def _disk(p: PathfinderParams, link: int, centre: tuple[float, float]):
    _, iy, ix, fy, fx = _anchor(centre)
    return (_shape(0.0, p.marker_radius, p.antialias, link, 0, fy, fx), iy, ix, False)


def _dash(canvas: _Canvas, path: _Path, start: tuple[float, float], angle: int, marker_at: str) -> bool:
    p = canvas.p
    start, iy, ix, fy, fx = _anchor(start)
    end = _step(start, angle, p.paddle_length)
    lo, hi = p.padding, p.resolution - p.padding
    if min(start[0], start[1], end[0], end[1]) < lo or max(start[0], start[1], end[0], end[1]) >= hi:
        return False  # cheap early exit: most rejected turns run off the canvas
    shape = _shape(p.paddle_length, p.paddle_thickness / 2, p.antialias, canvas.link, angle % _ANGLES, fy, fx)
    pieces = [(shape, iy, ix, True)]
    if marker_at:
        pieces.append(_disk(p, canvas.link, start if marker_at == "start" else end))
    record = canvas.place(pieces, path.k, p.path_contrast * p.paddle_contrast)
    if record is None:
        return False
    path.undo.append(record)
    path.ends.append(end)
    path.angles.append(angle % _ANGLES)
    if marker_at:
        path.markers[marker_at] = pieces[1]
        path.markers[marker_at + "_centre"] = start if marker_at == "start" else end
    return True


def _pop(canvas: _Canvas, path: _Path):
    canvas.undo(path.undo.pop())
    path.ends.pop()
    path.angles.pop()


def _grow(canvas, path, rng, length, margin, steps, weights, end_marker: bool, budget: int) -> bool:
    """Extend `path` to `length` dashes; on failure the path is left as it was.

    Each dash tries the turns in a weighted random order (sampling without replacement). When none fits,
    the previous dash is taken back and its remaining turns are tried (depth-first search), so a path that
    runs into a border or another path bends away where it can instead of throwing the image away.
    `budget` caps the dashes tried.
    """
    base = path.k
    stack = []  # (turn order, next position in it) for each dash placed here
    order = None
    while path.k < length:
        if order is None:
            # Efraimidis-Spirakis keys log(u) / w: sorting them is weighted sampling without replacement.
            order, pos = np.argsort(np.log(rng.random(len(weights))) / weights)[::-1], 0
        pivot = _step(path.end, path.angles[-1], margin / 2)
        placed = False
        while pos < len(order) and budget > 0:
            angle = path.angles[-1] + int(steps[order[pos]])
            pos += 1
            budget -= 1
            last = end_marker and path.k == length - 1
            if _dash(canvas, path, _step(pivot, angle, margin / 2), angle, "end" if last else ""):
                stack.append((order, pos))
                order, placed = None, True
                break
        if placed:
            continue
        if not stack or budget <= 0:
            while path.k > base:
                _pop(canvas, path)
            return False
        _pop(canvas, path)
        order, pos = stack.pop()
    return True


# Dashes tried per dash of a path before its layout is dropped, in units of the number of candidate turns.
_SEARCH_BUDGET = 1


def _targets(p: PathfinderParams, rng, margin, steps, weights, seed_tries: int = 10):
    """Both target paths, or None when this layout gets stuck."""
    canvas = _Canvas(p)
    budget = _SEARCH_BUDGET * p.contour_length * len(steps)
    lo, hi = p._seed_box()
    first = _Path(int(rng.integers(_ANGLES)))
    if not _dash(canvas, first, tuple(rng.uniform(lo, hi, size=2)), first.angles[0], "start"):
        return None
    if not _grow(canvas, first, rng, p.contour_length, margin, steps, weights, True, budget):
        return None
    canvas.finish_path()
    origin = first.markers["start_centre"]
    for _ in range(seed_tries):
        second = _Path(int(rng.integers(_ANGLES)))
        start = _step(origin, int(rng.integers(_ANGLES)), p.seed_distance)
        if _dash(canvas, second, start, second.angles[0], "start"):
            break
    else:
        return None
    if not _grow(canvas, second, rng, p.contour_length, margin, steps, weights, True, budget):
        return None
    canvas.finish_path()
    return canvas, [first, second]


def _distractors(canvas: _Canvas, p: PathfinderParams, rng, margin, steps, weights, tries: int = 20) -> int:
    placed = 0
    budget = _SEARCH_BUDGET * p.distractor_length * len(steps)
    for _ in range(p.num_distractors):
        for _ in range(tries):
            path = _Path(int(rng.integers(_ANGLES)))
            start = tuple(rng.uniform(p.padding, p.resolution - p.padding, size=2))
            if not _dash(canvas, path, start, path.angles[0], ""):
                continue
            if _grow(canvas, path, rng, p.distractor_length, margin, steps, weights, False, budget):
                canvas.finish_path()
                placed += 1
                break
            _pop(canvas, path)
    return placed


def render(p: PathfinderParams, rng: np.random.Generator, label: int) -> PathfinderSample:
    """Draw one image with the given label from `rng`."""
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label}")
    for _ in range(p.max_attempts):
        margin = float(p.margins[rng.integers(len(p.margins))])
        steps, weights = _turns(p, margin)
        built = _targets(p, rng, margin, steps, weights)
        if built is not None:
            break
    else:
        raise ValueError(
            f"could not lay out two target paths in {p.max_attempts} attempts with {p}; make the canvas "
            "larger or the paths shorter / thinner / less tightly spaced"
        )
    canvas, paths = built
    num_distractors = _distractors(canvas, p, rng, margin, steps, weights)
    origin = int(rng.integers(2))
    first = paths[origin]
    second = first if label == 1 else paths[1 - origin]
    canvas.paint(first.markers["start"])
    canvas.paint(second.markers["end"])
    # ceil keeps every touched pixel non-zero, so the drawn support is exactly what placement checked.
    image = np.minimum(np.ceil(np.clip(canvas.image, 0.0, 1.0) * 255.0), 255).astype(np.uint8)
    markers = (
        tuple(float(v) for v in first.markers["start_centre"]),
        tuple(float(v) for v in second.markers["end_centre"]),
    )
    return PathfinderSample(image=image, label=label, markers=markers, num_distractors=num_distractors)


def _label(seed: int, split: int, index: int) -> int:
    # Images come in pairs (2j, 2j+1) with one positive each, so any even-sized range is balanced
    # exactly, and which member is positive is random so labels carry no index pattern.
    flip = int(np.random.default_rng([seed, split, index // 2, 1]).integers(2))
    return int(index % 2 == flip)


def _check_index_args(seed: int, split: int, start: int):
    for name, v in (("seed", seed), ("split", split), ("start", start)):
        check_int(name, v)


def sample(p: PathfinderParams, seed: int, split: int, index: int) -> PathfinderSample:
    """Image `index` of split `split` for `seed`; independent of how the split is chunked."""
    _check_index_args(seed, split, index)
    rng = np.random.default_rng([seed, split, index, 0])
    return render(p, rng, _label(seed, split, index))


def generate(
    n: int,
    resolution: int,
    seed: int = 0,
    *,
    params: PathfinderParams | None = None,
    split: int = 0,
    start: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Images `start .. start+n-1` of a split.

    Returns images: (n, resolution, resolution) uint8 and labels: (n,) int64, half of them 1 (exactly, when
    `start` and `n` are even). `params` replaces the LRA settings for `resolution`.
    """
    check_int("n", n)
    _check_index_args(seed, split, start)
    if params is None:
        params = params_for(resolution)
    elif params.resolution != resolution:
        raise ValueError(f"params.resolution={params.resolution} does not match resolution={resolution}")
    images = np.empty((n, resolution, resolution), np.uint8)
    labels = np.empty((n,), np.int64)
    for i in range(n):
        s = sample(params, seed, split, start + i)
        images[i], labels[i] = s.image, s.label
    return images, labels
