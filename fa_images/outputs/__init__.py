"""The files a build is made of, from checked entries: Dockerfiles, build contexts, exports.

Uses ``config``'s entries; nothing here talks to a container engine (that is ``run``).
"""
