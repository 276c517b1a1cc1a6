"""The client compatibility suite: real client libraries against a real ``millm serve``.

Each module starts one server on a tiny random model (SmolLM2's tokenizer and chat
template, so no native tool support) with the test-only ``scripted_output`` plugin:
a request carrying ``X-Test-Scripted-Output`` makes the model write a given text,
otherwise it writes random text within whatever constraint the request sets.
Schemas here use enums and booleans only, so a random model finishes them in a few tokens.

Nothing may reach the network: the libraries' telemetry and price-list downloads are
switched off below, and a guard refuses any connection that is not to this machine (a client
run as a subprocess gets the same guard through ``offline_env``).

An agent loop sends several requests; ``scripted_turns`` scripts each from what it carries:
a tool call first, the answer once the tool's result is in the conversation.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel

from millm_host.testing import ServerProcess


def _bundled_tiktoken_cache() -> str | None:
    """litellm ships tiktoken's BPE files (cl100k_base among them) named as tiktoken's cache names them."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return str(folder) if folder.is_dir() else None


# Set before any client library is imported (they read these at import time). Every client
# here is given its base URL and a dummy key explicitly, so no OPENAI_* variable is needed.
_OFFLINE_ENV = {
    # litellm would otherwise download its price list on import and other catalogs on first use;
    # offline mode makes every one of them read the copy litellm ships.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
}
for _name, _value in _OFFLINE_ENV.items():
    os.environ[_name] = _value
for _name in ("LANGCHAIN_API_KEY", "LANGSMITH_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID"):
    os.environ.pop(_name, None)
_TIKTOKEN_FILES = _bundled_tiktoken_cache()
if _TIKTOKEN_FILES:
    # LangChain's OpenAIEmbeddings tokenizes with tiktoken's cl100k_base, which tiktoken
    # downloads on first use; litellm ships that file (and sets this same variable on import).
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", _TIKTOKEN_FILES)

LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost", "0.0.0.0"}


class NetworkRefused(RuntimeError):
    """A client library tried to reach a host other than this machine."""


def _check_host(host: object) -> None:
    if isinstance(host, bytes):
        host = host.decode()
    if isinstance(host, str) and host not in LOCAL_HOSTS:
        raise NetworkRefused(f"the client suite must stay offline, but something tried to reach {host!r}")


@pytest.fixture(autouse=True, scope="module")
def no_network() -> Iterator[None]:
    """Refuse every connection and name lookup that is not for this machine."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(self: socket.socket, address: object) -> object:
        if isinstance(address, tuple):
            _check_host(address[0])
        return real_connect(self, address)  # type: ignore[arg-type]

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if host is not None:
            _check_host(host)
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket, "getaddrinfo", getaddrinfo)
        yield


#: Loaded by ``sitecustomize`` into a client run as a subprocess (and the processes it spawns):
#: the same refusal as ``no_network``, which only covers this process.
_CHILD_GUARD = f"""
import socket

_LOCAL = {sorted(LOCAL_HOSTS)!r}
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo


def _check(host):
    host = host.decode() if isinstance(host, bytes) else host
    if isinstance(host, str) and host not in _LOCAL:
        raise ConnectionRefusedError(f"the client suite must stay offline, but something tried to reach {{host!r}}")


def connect(self, address):
    if isinstance(address, tuple):
        _check(address[0])
    return _connect(self, address)


def getaddrinfo(host, *args, **kwargs):
    if host is not None:
        _check(host)
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.getaddrinfo = connect, getaddrinfo
"""


@pytest.fixture(scope="module")
def offline_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for a client run as a subprocess: the network guard, and the Hugging Face hub offline.

    (Not set for the whole session: other tests point huggingface_hub at a local hub.)
    """
    folder = tmp_path_factory.mktemp("offline-guard")
    (folder / "sitecustomize.py").write_text(_CHILD_GUARD)
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """One ``millm serve`` for every client module, on the tiny model, scripted output enabled (a start
    costs about 7 s on 2 cores; the modules only send requests, none changes what the server holds)."""
    process = ServerProcess(
        tmp_path_factory.mktemp("clients"), model=str(tiny_model_dir), env={"SCRIPTED_OUTPUT_ENABLED": "true"}
    )
    with process:
        yield process


@pytest.fixture(scope="module")
def model(server: ServerProcess) -> str:
    """The served model's id."""
    return server.model_id


@pytest.fixture(scope="module")
def scripted() -> Callable[[str], dict[str, str]]:
    """``scripted(text)``: request headers that make the model write exactly ``text``."""
    from millm_scripted_output import HEADER, encode

    return lambda text: {HEADER: encode(text)}


def _holds_a_tool_result(body: object) -> bool:
    """Whether a chat or Responses request already carries a tool's result (the agent's second turn)."""
    if not isinstance(body, dict):
        return False
    items = [*(body.get("messages") or ()), *(body["input"] if isinstance(body.get("input"), list) else ())]
    return any(
        isinstance(item, dict) and (item.get("role") == "tool" or item.get("type") == "function_call_output")
        for item in items
    )


@pytest.fixture(scope="module")
def scripted_turns(scripted: Callable[[str], dict[str, str]]) -> Callable[[str, str], httpx.AsyncClient]:
    """``scripted_turns(call, answer)``: an httpx client for an agent loop's requests.

    The model writes ``call`` until the conversation holds a tool's result, then ``answer``:
    one script per turn, decided by the request itself, so retries and extra turns stay right.
    """

    def client(call: str, answer: str) -> httpx.AsyncClient:
        async def script(request: httpx.Request) -> None:
            body = json.loads(request.content) if request.content else None
            request.headers.update(scripted(answer if _holds_a_tool_result(body) else call))

        return httpx.AsyncClient(event_hooks={"request": [script]}, timeout=120)

    return client


class Weather(BaseModel):
    """A structured reply a random model completes in a few tokens (an enum and a boolean)."""

    city: Literal["Paris", "Rome"]
    sunny: bool


class GetWeather(BaseModel):
    """Get the weather in a city."""

    city: Literal["Paris", "Rome"]


#: GetWeather as an OpenAI tool definition (what every library sends for it).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "GetWeather",
        "description": "Get the weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]

#: What a model with no native tool format writes to call ``get_weather`` (the generic format,
#: as the structured_output plugin constrains it), and to answer in words once it has the result.
GENERIC_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
GENERIC_ANSWER = '{"response": "Sunny in Paris."}'


class Shapes:
    """The request and reply shapes the modules share (test modules cannot import this conftest)."""

    Weather = Weather
    GetWeather = GetWeather
    WEATHER_TOOL = WEATHER_TOOL
    QUESTION = QUESTION
    GENERIC_CALL = GENERIC_CALL
    GENERIC_ANSWER = GENERIC_ANSWER


@pytest.fixture(scope="session")
def shapes() -> type[Shapes]:
    """``shapes.Weather``, ``shapes.GetWeather``, ``shapes.WEATHER_TOOL``, ``shapes.QUESTION``, ``shapes.GENERIC_*``."""
    return Shapes
