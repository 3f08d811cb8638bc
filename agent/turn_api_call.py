"""Turn steps 7-8: build the request for the API mode and make the interruptible (streaming) call."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from mibyan.agent.adapters.base import CallHandle, NormalizedResponse, WireRequest
from mibyan.agent.callbacks import StreamRelay
from mibyan.agent.prompt_caching import append_ephemeral_notes, apply_prompt_caching
from mibyan.agent.protocol import AgentBase
from mibyan.agent.text_tool_calls import tool_calls_in_text
from mibyan.agent.turn_state import PreparedRequest, TurnState
from mibyan.core.http_transport import AbortableTransport
from mibyan.core.interruptible import StallLimit, call_interruptibly

if TYPE_CHECKING:
    pass


def with_text_tool_calls(response: NormalizedResponse, request: PreparedRequest) -> NormalizedResponse:
    """The reply with the tool calls its text spells out (a local model whose server's chat template
    does not parse them) made structured, so they run and are stored like any other; else as it is."""
    if response.tool_calls or not request.allow_tool_calls or not request.tools:
        return response
    found = tool_calls_in_text(response.content, frozenset(t.name for t in request.tools))
    if found is None:
        return response
    return dataclasses.replace(
        response, content=found.text, tool_calls=found.calls, finish_reason="tool_calls"
    )


#: Slack over the SDK's own timeout, so the SDK's clearer timeout error normally wins the race.
_TIMEOUT_SLACK = 5.0


class ApiCallMixin(AgentBase):
    """Makes one model call: request building, caching markers, the call itself, usage accounting."""

    def _abandon_call(self, handle: CallHandle, client: tuple[Any, AbortableTransport]) -> None:
        # Cutting the connections stops the provider generating for nobody; the next call gets a new client.
        handle.abandoned = True
        client[1].abort()
        if self.provider.client is client:
            self.provider.client = None

    def _learn_server(self, transport: AbortableTransport) -> None:
        """A server that says it is llama.cpp's is asked for its prompt progress from now on, in this run
        and (kept in the home) the next ones: its first call told us, whatever the model's name."""
        runtime = self.provider.runtime
        if runtime.prompt_progress or runtime.api_mode != "chat_completions":
            return
        if "llama.cpp" in (transport.server or ""):
            from mibyan.agent.window_discovery import remember_llama_cpp

            runtime.prompt_progress = True
            remember_llama_cpp(self.home, runtime.base_url)

    def _call_model_once(self, turn: TurnState, request: PreparedRequest) -> NormalizedResponse:
        """One call to the model. Raises TurnInterrupted, ProviderError or the SDK's own errors."""
        agent = self.settings.agent
        body = self.provider.adapter.build_request(
            WireRequest(
                model=self.provider.runtime.model,
                system_prompt=request.system_prompt,
                messages=request.messages,
                tools=request.tools,
                stream=agent.stream,
                max_tokens=agent.max_tokens,
                temperature=agent.temperature,
                allow_tool_calls=request.allow_tool_calls,
                prompt_progress=self.provider.runtime.prompt_progress,
            )
        )
        body = apply_prompt_caching(body, self.provider.runtime.api_mode)
        body = append_ephemeral_notes(body, self.provider.runtime.api_mode, request.notes)
        self.tools.hooks.before_llm(request.messages, request.tools)
        client = self.provider.sdk_client(self.settings)
        self.tools.start_mcp()  # while the model answers: its import would have delayed the request
        sdk = client[0]
        handle = CallHandle(wake=self._signal.notify)
        relay = StreamRelay(self.callbacks, self._signal, turn.shown_text, turn.shown_reasoning)
        relay.start()
        try:
            response = call_interruptibly(
                lambda: self.provider.adapter.send(
                    sdk,
                    body,
                    stream=agent.stream,
                    events=relay,
                    handle=handle,
                    timeout=agent.api_timeout,
                ),
                signal=self._signal,
                timeout=agent.api_timeout + _TIMEOUT_SLACK,
                on_abandon=lambda: self._abandon_call(handle, client),
                # Silence counts once the answer flows: reading the prompt (a local model on a CPU takes
                # many seconds for a long one) is bounded by api_timeout alone, as is a plain call.
                stall=StallLimit(handle.silence, agent.stream_stall_timeout, whole=handle.whole),
            )
        finally:
            relay.stop()
        if agent.stream:
            relay.finish()
        elif response.reasoning:
            # A stream shows reasoning as it arrives; a plain reply shows the whole of it at once.
            relay.on_reasoning(response.reasoning)
        self._learn_server(client[1])
        response = with_text_tool_calls(response, request)
        turn.api_calls += 1
        turn.usage.add(response.usage)
        self.session.store.events.record_model_call(
            self.session.session_id, self.provider.runtime.model, response.usage.as_dict()
        )
        if turn.request_estimate and response.usage.input_tokens:
            self._estimator.calibrate(turn.request_estimate, response.usage.input_tokens)
        self.tools.hooks.after_llm(response)
        return response
