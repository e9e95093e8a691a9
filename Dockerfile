# Two images from one file:
#   target `tidal` - the API, workers, beat and Flower (no GPU libraries);
#   target `vllm`  - the pinned vLLM OpenAI server with Tidal's scheduler plugin importable.
FROM python:3.11-slim AS tidal
WORKDIR /srv/tidal
COPY setup.cfg setup.py README.md ./
COPY config ./config
COPY tidal_api ./tidal_api
COPY tidal_workers ./tidal_workers
COPY tidal_engine ./tidal_engine
# /blobs is the file volume (TIDAL_BLOB_DIR in compose): a fresh named volume takes this directory's owner,
# so the `tidal` user can write uploads and outputs there.
RUN pip install --no-cache-dir ".[s3]" && useradd --create-home tidal && mkdir /blobs && chown tidal:tidal /blobs
USER tidal
ENV TIDAL_HOME=/home/tidal/.tidal
EXPOSE 8080 5555
CMD ["tidal", "serve"]

# The plugin imports only `config` and `tidal_engine`, and vLLM already brings
# prometheus-client and numpy, so it installs without dependencies.
FROM vllm/vllm-openai:v0.32.0 AS vllm
COPY setup.cfg setup.py README.md /opt/tidal/
COPY config /opt/tidal/config
COPY tidal_engine /opt/tidal/tidal_engine
COPY tidal_api /opt/tidal/tidal_api
COPY tidal_workers /opt/tidal/tidal_workers
RUN pip install --no-cache-dir --no-deps /opt/tidal
