# fedsim server / client image (CPU only). Built by docker-compose.yml; see deploy/README.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# CPU-only torch from PyTorch's CPU index first: the default index resolves to a CUDA build
# (gigabytes of libraries this image never uses).
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

# A C compiler for fedsim's Gaussian noise kernel (fedsim/training/gaussian.py compiles it on
# first use; without one the slower torch implementation of the same sampler runs).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# Dependencies change less often than the code: install them in their own layer.
COPY pyproject.toml README.md ./
COPY fedsim ./fedsim
RUN pip install .
# Build the kernel now (it is rebuilt at start-up where the host's CPU differs from this one's;
# if it cannot be built, fedsim says so in its log and uses the torch implementation).
RUN python -c "from fedsim.training.gaussian import native_kernel_available as ok; print('noise kernel compiled:', ok())"

COPY scenarios ./scenarios

# The scenario files name the data set relative to the repository root
# (../shared/datasets/mnist.npz); compose mounts it at /shared/datasets.
# Runs as root inside the container so that it can read the compose secret (secrets.json is
# mode 0600 on the host and keeps its owner when mounted).
CMD ["fedsim", "--help"]
