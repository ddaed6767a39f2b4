"""The matrix and what fa-images knows: ``matrix.yaml`` and ``compat.yaml`` in, frozen and checked entries out.

Nothing here builds, fetches for a build or writes a build's files; ``outputs`` and ``run`` take
the entries from here.
"""
