"""Routing with several HTTP processes (`--api-server-count`): request keys and control tags
carry their process's index, and the detokenizer splits a step's outputs by it, keeping each
process's outputs in their order."""

from __future__ import annotations

import pytest

from seq2serve.runtime.frontend.detokenizer_manager import _routed
from seq2serve.runtime.frontend.request_ids import client_rid, scoped_rid, server_of, server_tag
from seq2serve.runtime.messages.io_struct import BatchTokenOutput, ControlReply, TokenOutput
from seq2serve.runtime.messages.ipc import IpcNames


@pytest.mark.parametrize("user,rid", [("alice", "r1"), (None, "3/x"), ("a/b", "c:d"),
                                      ("12", "7/7"), ("", "")])
@pytest.mark.parametrize("server", [0, 1, 12])
def test_a_key_names_its_process_and_the_clients_rid(user, rid, server):
    key = scoped_rid(user, rid, server)
    assert server_of(key) == server and server_of(key + "-3") == server
    assert client_rid(key) == rid and client_rid(key + "-3") == rid + "-3"
    assert client_rid(scoped_rid(user, rid)) == rid  # one process: no prefix
    assert server_of(scoped_rid(user, rid)) == 0
    assert key != scoped_rid(user, rid, server + 1)


def test_the_detokenizer_sends_each_output_to_its_process_in_order():
    outs = [TokenOutput(rid=scoped_rid("u", f"r{i}", i % 3), new_token_ids=[i])
            for i in range(9)]
    routed = dict(_routed(BatchTokenOutput(outs)))
    assert sorted(routed) == [0, 1, 2]
    for server, batch in routed.items():
        assert [o.new_token_ids[0] for o in batch.outputs] == [server, server + 3, server + 6]
    reply = ControlReply("stats", server_tag("abc", 2), True)
    assert _routed(reply) == [(2, reply)]


def test_each_process_has_its_own_output_socket():
    names = IpcNames.new(dp_size=2, api_servers=3)
    assert len(set(names.tokenizer_inputs)) == 3
    assert names.for_api_server(1).tokenizer_input == names.tokenizer_inputs[1]
    one = IpcNames.new()
    assert one.tokenizer_inputs == (one.tokenizer_input,)
    with pytest.raises(AssertionError):
        names.tokenizer_input  # noqa: B018 - several: a process must pick its own
