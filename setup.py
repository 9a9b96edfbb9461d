"""The optional C extension (everything else is in pyproject.toml).

dataio.decode._region decodes only a crop's region of a JPEG through libjpeg-turbo (its headers:
Debian/Ubuntu `libjpeg62-turbo-dev` or `libjpeg-turbo8-dev`). `optional=True`: where it cannot be
built, `pip install -e .` still succeeds and the decoder uses simplejpeg, saying so once.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dataio.decode._region", ["dataio/decode/_region.c"], libraries=["jpeg"],
                             depends=["dataio/decode/_fasthuff.h"],
                             extra_compile_args=["-O2"], optional=True)])
