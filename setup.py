"""Build of agspeed: one C extension, agspeed._C, and the Python package.

The C sources are every .c file of csrc/, guards/ and backends/nvrtc/ (the fused
kernels' code generation and their CUDA driver, which opens libnvrtc and libcuda at run
time: nothing of CUDA is needed to build).  xxHash comes from
the system (Debian: libxxhash-dev); a missing header stops the build with
the package to install.  The build never imports torch.

Environment:
  AGSPEED_DEBUG=1   build with -O0 -g, assertions on and AddressSanitizer
                    (run the tests with libasan preloaded: scripts/asan.sh).
  XXHASH_PREFIX     where xxHash is installed, if not under /usr or
                    /usr/local.
"""
import glob
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _find_xxhash():
    prefixes = [p for p in (os.environ.get("XXHASH_PREFIX"), "/usr", "/usr/local") if p]
    for prefix in prefixes:
        if os.path.exists(os.path.join(prefix, "include", "xxhash.h")):
            return prefix
    sys.exit(
        "agspeed: xxhash.h not found (looked under %s).\n"
        "Install the xxHash development package: on Debian/Ubuntu "
        "`apt-get install libxxhash-dev`, or set XXHASH_PREFIX to where xxHash is "
        "installed." % ", ".join(prefixes)
    )


class BuildExt(build_ext):
    """Checks for xxHash only when something is actually compiled."""

    def build_extensions(self):
        prefix = _find_xxhash()
        for ext in self.extensions:
            if prefix not in ("/usr", "/usr/local"):
                ext.include_dirs.append(os.path.join(prefix, "include"))
                ext.library_dirs.append(os.path.join(prefix, "lib"))
        super().build_extensions()


def _flags():
    compile_args = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
    link_args = []
    if os.environ.get("AGSPEED_DEBUG") == "1":
        compile_args += ["-O0", "-g", "-UNDEBUG", "-DAGS_DEBUG=1",
                         "-fsanitize=address", "-fno-omit-frame-pointer"]
        link_args += ["-fsanitize=address"]
    else:
        compile_args += ["-O2"]
    return compile_args, link_args


compile_args, link_args = _flags()
sources = (sorted(glob.glob("csrc/*.c")) + sorted(glob.glob("guards/*.c"))
           + sorted(glob.glob("backends/nvrtc/*.c")))

setup(
    name="agspeed",
    version="0.1.0",
    description="Graph capture for unmodified PyTorch training code, in C.",
    python_requires=">=3.11,<3.14",
    packages=["agspeed", "agspeed.guards", "agspeed.backends", "agspeed.backends.nvrtc"],
    package_dir={
        "agspeed": "agspeed",
        "agspeed.guards": "guards",
        "agspeed.backends": "backends",
    },
    ext_modules=[
        Extension(
            "agspeed._C",
            sources=sources,
            include_dirs=["csrc", "guards", "backends/nvrtc"],
            libraries=["xxhash", "dl"],
            depends=(glob.glob("csrc/*.h") + glob.glob("guards/*.h")
                     + glob.glob("backends/nvrtc/*.h")),
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ],
    cmdclass={"build_ext": BuildExt},
    # the autotuner's progress bar, the cache location and the knowledge base's locks
    install_requires=["tqdm", "platformdirs", "filelock"],
    extras_require={"torch": ["torch>=2.1"]},
)
