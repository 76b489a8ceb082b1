"""libdsec: the Python client of the dsec sandbox platform.

Standard library only, Python 3.9 or newer. It speaks Connect's HTTP/JSON
protocol (unary calls and streaming envelopes) over keep-alive HTTP/1.1
connections.

    import asyncio
    from libdsec import DSecClient, DSecContainerRunArgs

    async def main():
        client = DSecClient(); await client.open()
        args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=256, cpu_cores_limit=1,
                                    ttl_running_stop=300, network_rules={}, init_user="root")
        sandbox = await client.run_container(args, timeout=120)
        result = await sandbox.run_shell("echo hello world")
        print(result.stdout, result.exit_code)
        await sandbox.stop()
        await client.close()

    asyncio.run(main())

For scripts and notebooks without asyncio, :mod:`libdsec.sync` has the same
API with plain calls.
"""

__version__ = "0.1.0"

from .errors import (AlreadyExistsError, ArchiveError, CapabilityMissingError, DeadlineExceededError,  # noqa: E402
                     DSecError, FailedPreconditionError, InternalError, InvalidArgumentError, NotFoundError,
                     PermissionDeniedError, ResourceExhaustedError, UnauthenticatedError, UnavailableError)
from .types import (BatchResult, DirListing, Event, ExecInfo, ExecResult, ExitStatus, FileInfo, Image,  # noqa: E402
                    ImageConfig, Key, Layer, OutputChunk, Resources, Stats, TarStats)
from .types import GradeResult, PauseResult, SessionInfo  # noqa: E402
from .config import Config, load_config  # noqa: E402
from .network import NetworkDenial, NetworkInfo, NetworkResult  # noqa: E402
from .pack import Pack  # noqa: E402
from .sandbox import Process, Sandbox, Session  # noqa: E402
from .rollout import Rollout, RolloutMember, member  # noqa: E402
from .types import Step, StepResult  # noqa: E402
from .client import DSecClient, DSecContainerRunArgs, WatchStream, parse_size  # noqa: E402
from .types import DiskUsage, GCResult, ImageDetails, KeptLayer, LayerUsage, Project, ProjectLimits  # noqa: E402

__all__ = [
    "DSecClient", "DSecContainerRunArgs", "Sandbox", "Process", "Session", "WatchStream", "parse_size",
    "SessionInfo", "GradeResult", "PauseResult",
    "Config", "load_config",
    "ExecResult", "ExitStatus", "OutputChunk", "ExecInfo", "FileInfo", "DirListing", "TarStats", "Stats",
    "Event", "BatchResult", "Resources", "Image", "ImageConfig", "Layer", "Key",
    "DiskUsage", "GCResult", "ImageDetails", "KeptLayer", "LayerUsage", "Project", "ProjectLimits",
    "DSecError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError", "FailedPreconditionError",
    "ResourceExhaustedError", "DeadlineExceededError", "UnauthenticatedError", "PermissionDeniedError",
    "UnavailableError", "InternalError", "CapabilityMissingError", "ArchiveError",
    "Pack", "NetworkInfo", "NetworkDenial", "NetworkResult",
    "Rollout", "RolloutMember", "member", "Step", "StepResult",
]
