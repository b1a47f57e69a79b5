#!/usr/bin/env python3
"""A FusionRL environment server in Python: the built-in "calculator"
environment served over gRPC (proto/fusionrl/v1/environment.proto).

A template to copy: replace CalculatorEpisode with your environment. A job
uses it with

    env:
      name: remote
      address: "127.0.0.1:50061"

Needs grpcio and grpcio-tools (Debian: python3-grpcio python3-grpc-tools).
The Python stubs are generated at startup from the repository's proto/
directory (or --proto-dir), so nothing generated is checked in.

    python3 calculator_server.py --port 50061
    python3 calculator_server.py --port 0     # prints "listening on PORT"

It answers exactly as the in-process "calculator" environment does: tool
results are the same bytes, final answers are graded the same way.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from concurrent import futures

import grpc
from grpc_tools import protoc

PROTO = "fusionrl/v1/environment.proto"


def load_stubs(proto_dir):
    """Generates the Python code of environment.proto into a temporary
    directory and imports it: (messages module, services module)."""
    if not os.path.isfile(os.path.join(proto_dir, PROTO)):
        sys.exit(f"calculator_server: {PROTO} not found under {proto_dir} "
                 "(use --proto-dir)")
    out = tempfile.mkdtemp(prefix="fusionrl_env_stubs_")
    rc = protoc.main(["grpc_tools.protoc", f"-I{proto_dir}",
                      f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_dir, PROTO)])
    if rc != 0:
        sys.exit(f"calculator_server: protoc failed on {PROTO} ({rc})")
    sys.path.insert(0, out)
    from fusionrl.v1 import environment_pb2, environment_pb2_grpc
    # Imported: the files are no longer needed.
    sys.path.remove(out)
    shutil.rmtree(out, ignore_errors=True)
    return environment_pb2, environment_pb2_grpc


# ---------------------------------------------------------------------------
# The calculator: exact int64 arithmetic, the grammar and limits of
# src/tasks/calculator.cc. No eval(): the policy writes the expression.

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
MAX_LENGTH = 256   # bytes
MAX_NESTING = 64   # parentheses
SPACES = " \t\n\r"
DIGITS = "0123456789"


class CalcError(Exception):
    pass


def escape(text):
    """`text` (one char per byte) with C-style escapes, as absl::CHexEscape
    writes it in the C++ messages."""
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"',
             "'": "\\'", "\\": "\\\\"}
    return "".join(named.get(c) or (c if " " <= c <= "~" else f"\\x{ord(c):02x}")
                   for c in text)


class Evaluator:
    """Recursive descent over
         expr    := term (('+' | '-') term)*
         term    := unary (('*' | '/') unary)*
         unary   := '-'* primary
         primary := number | '(' expr ')'
    Positions in messages are 1-based byte positions."""

    def __init__(self, text):
        # One char per UTF-8 byte, so positions count bytes as in C++.
        self.text = text.encode("utf-8").decode("latin-1")
        self.pos = 0

    def evaluate(self):
        self.skip_spaces()
        if self.pos == len(self.text):
            raise CalcError("empty expression")
        value = self.expr(0)
        if self.pos != len(self.text):
            if self.peek() == ")":
                raise CalcError(f"unmatched ')' at position {self.pos + 1}")
            raise CalcError(f"unexpected {self.found()} at position "
                            f"{self.pos + 1} (expected an operator)")
        return value

    def peek(self):
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def found(self):
        return f"'{escape(self.peek())}'" if self.peek() else \
            "end of expression"

    def at(self, chars):
        """Whether the next char is one of `chars` (never at the end)."""
        return self.peek() != "" and self.peek() in chars

    def skip_spaces(self):
        while self.at(SPACES):
            self.pos += 1

    @staticmethod
    def checked(value, lhs, op, rhs, op_pos):
        if not INT64_MIN <= value <= INT64_MAX:
            shown = f"({rhs})" if rhs < 0 else f"{rhs}"
            raise CalcError(f"{lhs}{op}{shown} at position {op_pos + 1} "
                            "does not fit in a 64-bit integer")
        return value

    def expr(self, depth):
        value = self.term(depth)
        while self.at("+-"):
            op, op_pos = self.peek(), self.pos
            self.pos += 1
            self.skip_spaces()
            rhs = self.term(depth)
            result = value + rhs if op == "+" else value - rhs
            value = self.checked(result, value, op, rhs, op_pos)
        return value

    def term(self, depth):
        value = self.unary(depth)
        while self.at("*/"):
            op, op_pos = self.peek(), self.pos
            self.pos += 1
            self.skip_spaces()
            rhs = self.unary(depth)
            if op == "*":
                value = self.checked(value * rhs, value, op, rhs, op_pos)
                continue
            if rhs == 0:
                raise CalcError(f"division by zero at position {op_pos + 1} "
                                f"({value}/0)")
            # Exact division only, so the quotient needs no rounding rule
            # (Python's // floors, C++'s / truncates: both agree here).
            if value % rhs != 0:
                raise CalcError(f"division {value}/{rhs} is not exact (at "
                                f"position {op_pos + 1}); only exact integer "
                                "division is supported")
            value = self.checked(value // rhs, value, op, rhs, op_pos)
        return value

    def unary(self, depth):
        minuses = 0
        while self.peek() == "-":
            minuses += 1
            self.pos += 1
            self.skip_spaces()
        negate = minuses % 2 == 1
        if self.at(DIGITS):
            return self.number(negate)
        value = self.primary(depth)
        if not negate:
            return value
        if value == INT64_MIN:
            raise CalcError(f"-({value}) does not fit in a 64-bit integer")
        return -value

    def primary(self, depth):
        if not self.peek():
            raise CalcError(f"expected a number or '(' at position "
                            f"{self.pos + 1}, found the end of the expression")
        if self.peek() != "(":
            raise CalcError(f"expected a number or '(' at position "
                            f"{self.pos + 1}, found {self.found()}")
        if depth >= MAX_NESTING:
            raise CalcError(f"parentheses nested deeper than {MAX_NESTING} "
                            f"at position {self.pos + 1}")
        open_pos = self.pos
        self.pos += 1
        self.skip_spaces()
        value = self.expr(depth + 1)
        if not self.peek():
            raise CalcError(f"unclosed '(' at position {open_pos + 1}")
        if self.peek() != ")":
            raise CalcError(f"unexpected {self.found()} at position "
                            f"{self.pos + 1} (expected an operator or ')')")
        self.pos += 1
        self.skip_spaces()
        return value

    def number(self, negate):
        start = self.pos
        while self.at(DIGITS):
            self.pos += 1
        digits = self.text[start:self.pos]
        value = -int(digits) if negate else int(digits)
        # A negated literal may be 2^63: -9223372036854775808 fits.
        if not INT64_MIN <= value <= INT64_MAX:
            if len(digits) > 40:
                digits = digits[:37] + "..."
            sign = "-" if negate else ""
            raise CalcError(f"the number {sign}{digits} at position "
                            f"{start + 1} does not fit in a 64-bit integer")
        self.skip_spaces()
        return value


def evaluate_arithmetic(expression):
    """The value of `expression` as a decimal string; CalcError if invalid."""
    size = len(expression.encode("utf-8"))
    if size > MAX_LENGTH:
        raise CalcError(f"expression is {size} characters long; the limit "
                        f"is {MAX_LENGTH}")
    return str(Evaluator(expression).evaluate())


# ---------------------------------------------------------------------------
# The environment: what an episode keeps and how it answers a turn.

CALC_TOOL = {
    "name": "calc",
    "description": "Evaluates integer arithmetic: + - * / and parentheses",
    "parameters_json": '{"type": "object", "properties": {"expression": '
                       '{"type": "string", "description": "e.g. 347*29"}}, '
                       '"required": ["expression"]}',
}
ASCII_WHITESPACE = " \t\n\v\f\r"


def reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def answer_calc(call):
    """The calc tool's reply to one call: the value or "error: ..."."""
    if call.name != CALC_TOOL["name"]:
        name = escape(call.name.encode("utf-8").decode("latin-1"))
        return f"error: unknown tool '{name}' (offered: calc)"
    try:
        # Strict JSON as the C++ parser reads it: no NaN / Infinity.
        args = json.loads(call.arguments_json, parse_constant=reject_constant)
    except ValueError:
        args = None
    if not isinstance(args, dict) or not isinstance(args.get("expression"),
                                                    str):
        return 'error: calc takes {"expression": "<arithmetic>"}'
    try:
        return evaluate_arithmetic(args["expression"])
    except CalcError as e:
        return f"error: {e}"


class CalculatorEpisode:
    def __init__(self, problem, seed):
        self.answer = problem.answer
        self.seed = seed  # unused: the calculator has no randomness

    def step(self, turn, pb):
        """The Observation for one assistant turn."""
        obs = pb.EnvObservation()
        if turn.tool_calls or turn.call_errors:
            # Call errors are answered by the rollout itself.
            for call in turn.tool_calls:
                obs.messages.add(role="tool", content=answer_calc(call))
            obs.metrics["calc_calls"] = float(len(turn.tool_calls))
            return obs
        # No calls: the final answer, graded as the "exact" reward does.
        correct = (turn.content.strip(ASCII_WHITESPACE) ==
                   self.answer.strip(ASCII_WHITESPACE))
        obs.done = True
        obs.reward = 1.0 if correct else 0.0
        obs.correct = correct
        return obs


# ---------------------------------------------------------------------------
# The gRPC service: episodes by id, NOT_FOUND for unknown ids.

def make_servicer(pb, pb_grpc, args):
    class EnvironmentService(pb_grpc.EnvironmentServiceServicer):
        def __init__(self):
            self.lock = threading.Lock()
            self.episodes = {}
            self.steps = 0  # Step calls so far (for the test knobs)

        def Open(self, request, context):
            episode_id = uuid.uuid4().hex
            with self.lock:
                self.episodes[episode_id] = CalculatorEpisode(
                    request.problem, request.seed)
            # No messages: the task's own conversation is used.
            return pb.OpenEpisodeResponse(episode_id=episode_id,
                                          tools=[pb.EnvTool(**CALC_TOOL)])

        def Step(self, request, context):
            with self.lock:
                self.steps += 1
                n = self.steps
                episode = self.episodes.get(request.episode_id)
            if n == args.hang_on_step:
                while True:  # never answers: the client's deadline runs out
                    time.sleep(3600)
            if n == args.exit_on_step:
                os._exit(1)  # a crashed server: connections drop mid-call
            if args.delay_ms > 0:
                time.sleep(args.delay_ms / 1000.0)  # a slow tool
            if episode is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"no open episode '{request.episode_id}'")
            return pb.StepEpisodeResponse(observation=episode.step(
                request.turn, pb))

        def Close(self, request, context):
            with self.lock:
                self.episodes.pop(request.episode_id, None)
            if not request.truncated:
                return pb.CloseEpisodeResponse()  # the answer is ignored
            # A limit cut the episode (request.reason; request.cut_turn is
            # the turn cut inside, if any): this is our verdict on it. The
            # calculator's, as the in-process one: no final answer was
            # given, so the reward of a wrong one. Leave reward unset for
            # the task's reward of the last turn's content.
            return pb.CloseEpisodeResponse(reward=0.0, correct=False)

    return EnvironmentService()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50061,
                        help="0 = any free port, printed as 'listening on "
                             "PORT'")
    parser.add_argument("--proto-dir",
                        default=os.path.join(here, "..", "..", "proto"),
                        help="directory holding fusionrl/v1/environment.proto")
    parser.add_argument("--threads", type=int, default=16,
                        help="calls served at once (match env.max_concurrency)")
    parser.add_argument("--delay-ms", type=float, default=0,
                        help="answer each Step this much later (a slow "
                             "tool, for measuring the rollout's overlap)")
    # Test-only knobs (tests/env_server_python_test.sh): 1-based Step calls.
    parser.add_argument("--hang-on-step", type=int, default=0,
                        help=argparse.SUPPRESS)
    parser.add_argument("--exit-on-step", type=int, default=0,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()

    pb, pb_grpc = load_stubs(os.path.abspath(args.proto_dir))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.threads))
    pb_grpc.add_EnvironmentServiceServicer_to_server(
        make_servicer(pb, pb_grpc, args), server)
    host = f"[{args.host}]" if ":" in args.host else args.host
    port = server.add_insecure_port(f"{host}:{args.port}")
    if port == 0:
        sys.exit(f"calculator_server: cannot listen on {host}:{args.port}")
    server.start()
    print(f"listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
