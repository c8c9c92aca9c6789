# Production image of the keyserver. The HSM is a PKCS#11 module by path: SoftHSM2
# is included for evaluation; mount your vendor's module and set STRONGROOM_HSM_MODULE.
# The compiled format engine (agents/dataplane) is built in a stage of its own: the agent
# wheel this server hands to hosts carries libsrcf.so for this image's platform.
FROM python:3.11-slim-bookworm AS dataplane
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev make \
    && rm -rf /var/lib/apt/lists/*
COPY agents/dataplane /src/dataplane
RUN make -C /src/dataplane clean lib

FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends softhsm2 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/strongroom --create-home strongroom
WORKDIR /opt/strongroom
COPY pyproject.toml README.md ./
COPY keyserver ./keyserver
COPY hsm ./hsm
COPY agents ./agents
COPY --from=dataplane /src/dataplane/build/libsrcf.so ./agents/dataplane/build/libsrcf.so
COPY migrations ./migrations
COPY webui/dist ./webui/dist
RUN pip install --no-cache-dir .
USER strongroom
ENV STRONGROOM_DATA_DIR=/var/lib/strongroom \
    STRONGROOM_HOST=0.0.0.0 \
    STRONGROOM_KMIP_HOST=0.0.0.0 \
    STRONGROOM_AGENT_HOST=0.0.0.0
EXPOSE 8800 5696 8443
# The probe asks the server itself over loopback: whose certificate it presents (the
# internal CA's or the operator's, for other names) is not what it checks.
HEALTHCHECK CMD python -c "import ssl,urllib.request; urllib.request.urlopen('https://127.0.0.1:8800/readyz', context=ssl._create_unverified_context())" || exit 1
CMD ["keyserver", "serve"]
