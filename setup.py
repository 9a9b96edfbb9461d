"""The optional C extensions (everything else is in pyproject.toml).

dataio.decode._region decodes only a crop's region of a JPEG through libjpeg-turbo (its headers:
Debian/Ubuntu `libjpeg62-turbo-dev` or `libjpeg-turbo8-dev`). dataio.stream._token_runs copies a token
batch's rows and writes its doc_ids and position_ids, one pass each (no library; -O3 vectorizes its loops).
`optional=True`: where one cannot be built, `pip install -e .` still succeeds; the decoder then uses
simplejpeg, saying so once, and token batches are made by numpy (the same batches, more slowly).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("dataio.decode._region", ["dataio/decode/_region.c"], libraries=["jpeg"],
                             depends=["dataio/decode/_fasthuff.h"],
                             extra_compile_args=["-O2"], optional=True),
                   Extension("dataio.stream._token_runs", ["dataio/stream/_token_runs.c"], extra_compile_args=["-O3"],
                             optional=True)])
