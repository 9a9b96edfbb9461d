"""Bytes to pixels: the image header parser and checks, crop geometry, the CPU decoder, DALI."""
