"""Solution to notebook 11's exercise: the groups of ranks along one dimension of a device mesh.

Lay the ranks out row-major in an array of ``shape``; a group along ``dim`` fixes every other
coordinate and varies ``dim``: move that axis last and read the rows.

>>> mesh_groups((2, 2), 0), mesh_groups((2, 2), 1)
([[0, 2], [1, 3]], [[0, 1], [2, 3]])
"""
import numpy as np


def mesh_groups(shape, dim):
    ranks = np.arange(int(np.prod(shape))).reshape(shape)
    return np.moveaxis(ranks, dim, -1).reshape(-1, shape[dim]).tolist()
