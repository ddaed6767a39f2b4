"""fa-images: flash-attn wheels and images built right for an exact Python, torch and CUDA."""

__version__ = "0.1.0"
