"""The MPI transport provides every member of the engine's Transport protocol
(read from the source, so no MPI communicator is made here)."""

import ast
import pathlib
import typing

from hvd_partial.transport import protocol
from hvd_partial.transport.protocol import Transport


def _protocol_members():
    methods = {name for name, value in vars(Transport).items()
               if callable(value) and not name.startswith("_")}
    attributes = set(typing.get_type_hints(Transport, localns={"Doorbell": object, "QuorumCounters": object,
                                                               "np": object}, include_extras=False))
    return methods, attributes


def test_the_protocol_names_what_the_engine_reads_of_a_transport():
    methods, attributes = _protocol_members()
    assert {"send", "receive", "progress_sends", "retain_unfinished_sends", "new_stream_comm",
            "stream_comm_ready", "iallreduce_in_place", "done", "barrier", "free"} <= methods
    assert {"rank", "size", "doorbell", "quorum_counters", "helpers", "tag_base"} <= attributes


def test_the_mpi_transport_provides_every_member():
    source = pathlib.Path(protocol.__file__).with_name("mpi.py").read_text()
    (cls,) = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "MpiTransport"]
    defined = {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    (init,) = [node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    assigned = {target.attr for node in ast.walk(init) if isinstance(node, ast.Assign)
                for t in node.targets for target in (t.elts if isinstance(t, ast.Tuple) else [t])
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"}
    methods, attributes = _protocol_members()
    assert methods - defined == set()
    assert attributes - assigned == set()
