"""agentmux from Python: publish typed agent output to an agentmux stream and watch streams in any of its wire
formats, sync (`Client`) or async (`AsyncClient`).

- The producer: `with client.stream() as run:` (`async with aclient.stream() as run:`), whose emit methods
  enqueue and return at once, batched into few POSTs, retried safely (`producer.py`, `async_producer.py`).
- The watcher: `client.watch(stream_id)`, resumed across cut connections, with the reduced state
  (`watch.py`, `reduce.py`); `LaggedError` and `EpochChangedError` as in the TypeScript client.
- The message types (`agentmux.types`), generated from the service's JSON Schemas.
"""

from .api import Appended, Created, Ended
from .async_client import AsyncChatRun, AsyncClient
from .async_producer import AsyncProducer
from .client import ChatRun, Client
from .emitter import Block, TextStream, ToolCallStream
from .errors import AgentmuxError, DeltaError, EpochChangedError, LaggedError
from .producer import Producer
from .reduce import StreamState, initial_state, reduce
from .watch import Update

__all__ = [
    "AgentmuxError",
    "Appended",
    "AsyncChatRun",
    "AsyncClient",
    "AsyncProducer",
    "Block",
    "ChatRun",
    "Client",
    "Created",
    "DeltaError",
    "Ended",
    "EpochChangedError",
    "LaggedError",
    "Producer",
    "StreamState",
    "TextStream",
    "ToolCallStream",
    "Update",
    "initial_state",
    "reduce",
]
