"""Builds a flash-attn wheel that is right for the torch it sits next to.

This package is the single builder recipe. It runs natively (``fa-images wheel``) and
inside the builder stage of every rendered Dockerfile (``python -m fa_images.builder``),
so it depends on nothing but the standard library, ``packaging`` and the torch it builds
against. Keep it that way: the rest of ``fa_images`` may import it, never the reverse.
"""
