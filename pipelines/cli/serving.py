"""The serving commands of ``kfloop``: serve-model (a registered version behind Open Inference Protocol v2) and
render-serving (its KServe InferenceService). As in :mod:`pipelines.cli.commands`, which imports this module, each
handler imports its stack when it runs."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from collections.abc import Callable

import pipelines.cli.options as options
from data.errors import UsageError

KSERVE_DEFAULT_GRPC_PORT = 8081
"""The gRPC port of KServe's model servers (``kserve.constants.DEFAULT_GRPC_PORT``)."""


def add_parsers(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the serving subcommands through ``command(name, one-line description)``, which makes a subparser."""
    serve = command("serve-model", "serve a registered version over Open Inference Protocol v2 (KServe SDK)")
    options.add_model(serve, "registered model served, and the model name of the v2 paths")
    _add_version(serve, with_dir=True)
    serve.add_argument("--artifact-digest", metavar="sha256:HEX",
                       help="with --model-dir: refuse to start unless the folder's non-empty files have this digest "
                            "(the InferenceService's serving.kfloop.io/artifact-digest, passed by the ServingRuntime "
                            "render-serving prints); not given or empty: the folder is loaded unchecked (local use)")
    serve.add_argument("--port", type=int, default=8080, help="HTTP port of the v2 REST API (default: %(default)s)")
    serve.add_argument("--grpc-port", type=int, default=KSERVE_DEFAULT_GRPC_PORT,
                       help="gRPC port of the v2 API (default: %(default)s)")
    serve.add_argument("--log-dir", metavar="DIR|URI",
                       help="log every request and its response under this folder or object URI as KServe's payload "
                            "logger writes its blobs (what `drift --current-logs` reads)")
    options.add_settings(serve)

    render = command("render-serving", "the KServe InferenceService and ServingRuntime of a registered version")
    options.add_model(render)
    _add_version(render, with_dir=False)
    render.add_argument("--canary", type=int, metavar="PERCENT",
                        help="send PERCENT of the traffic to this version, the rest to the last rolled-out one "
                             "(canaryTrafficPercent, 0-100)")
    render.add_argument("--kserve", choices=["0.20", "0.16"], default="0.20",
                        help="KServe release of the cluster: 0.20, or 0.16 as bundled by Kubeflow 26.03 (JSON-only "
                             "blob logging) (default: %(default)s)")
    options.add_json(render, "the manifests (a JSON list instead of YAML documents)")
    options.add_settings(render)


def _add_version(parser: argparse.ArgumentParser, *, with_dir: bool) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--version", help="version number (default: --alias champion)")
    which.add_argument("--alias", help="alias of the version, e.g. champion (the default)")
    if with_dir:
        which.add_argument("--model-dir", help="serve this downloaded MLflow model folder instead (e.g. the storage "
                                               "initializer's /mnt/models); the registry is not read")


def _source(args: argparse.Namespace):
    from training.registry.versions import CHAMPION_ALIAS
    from training.serving.load import ModelSource

    model = options.model_name(args)
    default_alias = "" if args.version or getattr(args, "model_dir", None) else CHAMPION_ALIAS
    return ModelSource(model_name=model, version=args.version or "", alias=args.alias or default_alias,
                       model_dir=getattr(args, "model_dir", None) or "",
                       digest=getattr(args, "artifact_digest", None) or "")


def cmd_serve_model(args: argparse.Namespace) -> int:
    source = _source(args)  # the settings are checked first: model_name may come from them
    if not 0 < args.port < 65536 or not 0 < args.grpc_port < 65536 or args.port == args.grpc_port:
        raise UsageError(f"--port {args.port} --grpc-port {args.grpc_port}: use two different ports in 1-65535")
    if not source.model_dir:
        options.registry_environment(args, source.model_name)
    # kserve's model_server parses the process's argv when imported (kserve 0.21.0 kserve/model_server.py:225,
    # parse_known_args): kfloop's flags are not its flags
    del sys.argv[1:]
    from training.registry.versions import model_version
    from training.serving.predictor import KfloopPredictor, serve

    if source.alias:  # the logs name the version that answered, not the alias that moves
        source = replace(source, version=str(model_version(source.model_name, source.alias).version), alias="")
    hook = _inference_logger(args.log_dir, source) if args.log_dir else None
    serve(KfloopPredictor(source.model_name, source, on_inference=hook), http_port=args.port,
          grpc_port=args.grpc_port)
    return 0


def _inference_logger(log_dir: str, source):
    """The predictor's hook writing each answered request with its response through
    :class:`monitoring.inference_logs.InferenceLogWriter`, tagged with the served model and version."""
    from data.storage import check_uri
    from monitoring.inference_logs import UNKNOWN_VERSION, InferenceLogWriter

    writer = InferenceLogWriter(check_uri(log_dir))

    def log(request, response) -> None:
        writer.log(request.id, _rest_body(request), _rest_body(response), model=source.model_name,
                   version=source.version or UNKNOWN_VERSION)
    return log


def _rest_body(message) -> bytes:
    """The REST JSON of a v2 request or response, also when it came over gRPC (its ``BYTES`` data as ``bytes``,
    its parameters as protobuf ``InferParameter``: written as the REST API carries them, text and plain values)."""
    import json

    from kserve.protocol.infer_type import to_http_parameters

    def plain(value):
        if isinstance(value, bytes):
            return value.decode()
        if hasattr(value, "tolist"):  # numpy arrays and scalars
            return value.tolist()
        return to_http_parameters({"value": value})["value"]  # a protobuf InferParameter

    body, _ = message.to_rest()
    return body if isinstance(body, bytes) else json.dumps(body, default=plain).encode()


def cmd_render_serving(args: argparse.Namespace) -> int:
    import yaml

    from training.launch.kubernetes import KubernetesSettings
    from training.serving.manifests import render_serving
    from training.serving.settings import ServingSettings

    settings = options.settings(args)
    source = _source(args)
    options.registry_environment(args, source.model_name)
    docs = render_serving(source, ServingSettings.from_dict(settings.get("serving")),
                          KubernetesSettings.from_dict(dict(settings.get("cluster", {}))).cluster,
                          canary_percent=args.canary, kserve=args.kserve)
    options.print_json(docs) if args.json else sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


COMMANDS = {"serve-model": cmd_serve_model, "render-serving": cmd_render_serving}
