"""Pathfinder generator: label semantics checked from pixels alone, determinism, balance, bad inputs."""

import numpy as np
import pytest

from data.lra import pathfinder as pf


def _components(image: np.ndarray, link: int) -> np.ndarray:
    """Component id per pixel (-1 for background); non-zero pixels within Chebyshev `link` are joined.

    Union-find over pixel pairs, written independently of the generator's placement bookkeeping.
    """
    h, w = image.shape
    ys, xs = np.nonzero(image)
    index = np.full((h, w), -1, np.int64)
    index[ys, xs] = np.arange(ys.size)
    parent = np.arange(ys.size)

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for dy in range(0, link + 1):
        for dx in range(-link, link + 1):
            if dy == 0 and dx <= 0:
                continue
            ny, nx = ys + dy, xs + dx
            ok = (ny < h) & (nx >= 0) & (nx < w)
            src, dst = np.nonzero(ok)[0], index[ny[ok], nx[ok]]
            for a, b in zip(src[dst >= 0], dst[dst >= 0], strict=True):
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    labels = np.full((h, w), -1, np.int64)
    labels[ys, xs] = [find(i) for i in range(ys.size)]
    return labels


@pytest.mark.parametrize("resolution,count", [(32, 200), (64, 200), (128, 12), (256, 6)])
def test_markers_connected_exactly_when_label_is_one(resolution, count):
    params = pf.params_for(resolution)
    labels = []
    for i in range(count):
        s = pf.sample(params, seed=11, split=0, index=i)
        comp = _components(s.image, params.link_distance)
        (ay, ax), (by, bx) = s.markers
        a, b = comp[int(ay), int(ax)], comp[int(by), int(bx)]
        assert a >= 0 and b >= 0, "marker centres must be drawn"
        assert s.image[int(ay), int(ax)] == 255 and s.image[int(by), int(bx)] == 255
        assert (a == b) == (s.label == 1), f"image {i}: markers connected={a == b} but label={s.label}"
        # Two targets (one may carry both markers) plus distractors: never fewer than 2 path components.
        assert np.unique(comp[comp >= 0]).size >= 2
        labels.append(s.label)
    assert sum(labels) == count // 2
    if count >= 200:  # which image of a pair is positive is random, not a fixed index pattern
        assert 0.35 < np.mean(labels[0::2]) < 0.65


def test_generate_shapes_dtypes_and_balance():
    images, labels = pf.generate(10, 32, seed=1)
    assert images.shape == (10, 32, 32) and images.dtype == np.uint8
    assert labels.shape == (10,) and labels.dtype == np.int64
    assert labels.sum() == 5
    # Paths and markers are sparse on a black background, and the padding stays empty.
    assert 0.05 < (images > 0).mean() < 0.6
    p = pf.params_for(32)
    assert not images[:, : p.padding].any() and not images[:, :, -p.padding :].any()


def test_determinism_and_chunk_independence():
    a, la = pf.generate(6, 32, seed=4, split=1)
    b, lb = pf.generate(6, 32, seed=4, split=1)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    # Image i depends on (seed, split, i) only: a later chunk reproduces the tail of the whole range.
    c, lc = pf.generate(3, 32, seed=4, split=1, start=3)
    np.testing.assert_array_equal(a[3:], c)
    np.testing.assert_array_equal(la[3:], lc)
    d, _ = pf.generate(6, 32, seed=5, split=1)
    e, _ = pf.generate(6, 32, seed=4, split=2)
    assert not np.array_equal(a, d) and not np.array_equal(a, e)


def test_distractors_are_drawn():
    counts = [pf.sample(pf.params_for(64), 0, 0, i).num_distractors for i in range(10)]
    assert np.mean(counts) >= 3


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: pf.generate(2, 48), "resolution 48"),
        (lambda: pf.generate(-1, 32), "n must be"),
        (lambda: pf.generate(2, 32, seed=-3), "seed must be"),
        (lambda: pf.generate(True, 32), "n must be an int >= 0, got True"),  # (numpy's TypeError)
        (lambda: pf.generate(2, 32, seed=True), "seed must be an int >= 0, got True"),  # (read as seed 1)
        (lambda: pf.generate(2, 32, params=pf.params_for(64)), "does not match"),
        (lambda: pf.render(pf.params_for(32), np.random.default_rng(0), label=2), "label must be"),
    ],
)
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _with(**changes):
    fields = {**pf.params_for(32).__dict__, **changes}
    return pf.PathfinderParams(**fields)


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"paddle_thickness": 0}, "thickness"),
        ({"margins": ()}, "margins"),
        ({"continuity": 0.3}, "continuity"),
        ({"seed_distance": 20}, "seed_distance"),
        ({"padding": 16}, "padding"),
        ({"contour_length": 1}, "contour_length"),
    ],
)
def test_bad_params_raise(changes, match):
    with pytest.raises(ValueError, match=match):
        _with(**changes)


def test_impossible_layout_fails_clearly():
    params = _with(contour_length=60, max_attempts=3)
    with pytest.raises(ValueError, match="could not lay out"):
        pf.generate(1, 32, params=params)


def test_custom_params_render():
    params = _with(num_distractors=0, contour_length=6)
    images, labels = pf.generate(4, 32, params=params)
    assert images.shape == (4, 32, 32) and labels.sum() == 2
