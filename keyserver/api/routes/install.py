"""What a new host needs before it has an identity: the CA certificate, the installer
and the agent package (public, as any package mirror), and, for operators, how to
enroll a host."""

from __future__ import annotations

from importlib.resources import files

from cryptography import x509
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from keyserver.api.deps import Ctx, ServicesDep
from keyserver.core.ca import display_fingerprint
from keyserver.core.errors import NotFound
from keyserver.core.permissions import Permission
from keyserver.runtime.agentdist import agent_wheel
from keyserver.runtime.agentport import install_command, loopback_warning

router = APIRouter(tags=["install"])
PEM = "application/x-pem-file"


class EnrollmentInfo(BaseModel):
    agent_url: str | None = Field(description="the agent port as hosts reach it; null when it is disabled")
    install_url: str | None
    ca_pem: str
    ca_fingerprint_sha256: str = Field(description="colon-separated upper-case hex, as `openssl x509 -fingerprint`")
    agent_version: str
    install_command: str | None = Field(
        description="the one-liner to run on a host, with `TOKEN` where the enrollment token goes")
    install_command_warning: str | None = Field(
        description="why the one-liner would not work from another host (the agent port's address is this "
                    "machine's loopback) and which setting fixes it; null when it would")


def _agent_url(request: Request, services: ServicesDep) -> str:
    """The address this request reached the agent port at (it works for the host that
    asked), else the configured one."""
    if "tls" in request.scope.get("extensions", {}):
        return str(request.base_url).rstrip("/")
    if services.agent_url is None:
        raise NotFound("the agent port is disabled (STRONGROOM_AGENT_ENABLED=false)", code="agent_port_disabled")
    return services.agent_url


@router.get("/ca.pem", operation_id="getCaCertificate", response_class=Response,
            responses={200: {"content": {PEM: {}}}})
def ca_certificate(services: ServicesDep) -> Response:
    """The internal CA's certificate: hosts and KMIP clients pin it."""
    return Response(services.ca.certificate_pem(), media_type=PEM,
                    headers={"content-disposition": 'attachment; filename="ca.pem"'})  # the one-liner's name


@router.get("/install.sh", operation_id="getAgentInstaller", response_class=Response,
            responses={200: {"content": {"text/x-shellscript": {}}}})
def installer(request: Request, services: ServicesDep) -> Response:
    """The agent installer, for `curl -fsS --cacert ca.pem https://SERVER:8443/install.sh | sh -s -- --token T`."""
    wheel = agent_wheel()
    script = (files("keyserver") / "templates" / "install.sh").read_text()
    for name, value in (("SERVER_URL", _agent_url(request, services)), ("WHEEL", wheel.filename),
                        ("WHEEL_SHA256", wheel.sha256), ("CA_PEM", services.ca.certificate_pem().decode().strip())):
        script = script.replace(f"@{name}@", value)
    return Response(script, media_type="text/x-shellscript")


@router.get("/downloads/{filename}", operation_id="downloadAgent", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}}})
def download(filename: str) -> Response:
    """The agent package (a wheel of `agents/`, matching this server's version)."""
    wheel = agent_wheel()
    if filename != wheel.filename:
        raise NotFound(f"no download named {filename!r}; this server offers {wheel.filename}",
                       code="download_not_found")
    return Response(wheel.data, media_type="application/octet-stream",
                    headers={"content-disposition": f'attachment; filename="{wheel.filename}"',
                             "x-checksum-sha256": wheel.sha256})


@router.get("/api/v1/enrollment-info", operation_id="getEnrollmentInfo", response_model=EnrollmentInfo)
def enrollment_info(ctx: Ctx, services: ServicesDep) -> EnrollmentInfo:
    """What an operator needs to enroll a host: the installer one-liner and the CA to pin."""
    services.policy.require(ctx, Permission.HOSTS_READ, action="enrollment_info.read")
    ca_pem = services.ca.certificate_pem()
    url = services.agent_url
    return EnrollmentInfo(
        agent_url=url, install_url=f"{url}/install.sh" if url else None, ca_pem=ca_pem.decode(),
        ca_fingerprint_sha256=display_fingerprint(x509.load_pem_x509_certificate(ca_pem)),
        agent_version=agent_wheel().version,
        install_command=install_command(url) if url else None,
        install_command_warning=loopback_warning(url) if url else None)
