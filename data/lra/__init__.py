"""Long Range Arena data: Pathfinder / Path-X / Path-256 images and ListOps expressions.

`pathfinder` and `listops` generate examples deterministically from a seed; `dataset` builds the cached
`datasets` splits from them in parallel processes.
"""
