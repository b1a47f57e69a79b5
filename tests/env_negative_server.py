#!/usr/bin/env python3
"""A test environment server with rewards of its own, written against
proto/fusionrl/v1/environment.proto (not against FusionRL's code): the
reference of tests/env_negative_reward_test.sh and
tests/env_unavailable_test.sh.

The calculator tool (examples/env_server/calculator_server.py's), and one
user feedback turn: a turn without calls is the final answer; right: done
with 1.0 (0.5 after the feedback); a first wrong answer gets the user's
"no" (not done), a second is done with -0.25. An episode the client cuts
(Close flagged truncated) gets -0.75. Every last word it gives (done or
cut) is appended to --log as a JSON line {"seed", "reward", "how",
"reason", "cut_turn"}: what the job must have trained on.

    env_negative_server.py --port 0 --log FILE [--exit-on-step N]
"""

import argparse
import json
import os
import sys
import threading
import uuid
from concurrent import futures

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "env_server"))
from calculator_server import (ASCII_WHITESPACE, CALC_TOOL,  # noqa: E402
                               answer_calc, load_stubs)

RIGHT, RIGHT_AFTER_NO, WRONG, CUT = 1.0, 0.5, -0.25, -0.75


class Episode:
    def __init__(self, problem, seed):
        self.answer = problem.answer.strip(ASCII_WHITESPACE)
        self.seed = seed
        self.told = False

    def step(self, turn, pb):
        """(observation, reward or None when not done)."""
        obs = pb.EnvObservation()
        if turn.tool_calls or turn.call_errors:
            for call in turn.tool_calls:
                obs.messages.add(role="tool", content=answer_calc(call))
            return obs, None
        if turn.content.strip(ASCII_WHITESPACE) == self.answer:
            obs.done = True
            obs.reward = RIGHT_AFTER_NO if self.told else RIGHT
            return obs, obs.reward
        if not self.told:
            self.told = True
            obs.messages.add(role="user", content="no")
            return obs, None
        obs.done = True
        obs.reward = WRONG
        return obs, WRONG


def make_servicer(pb, pb_grpc, args):
    log_lock = threading.Lock()

    def log(**record):
        with log_lock, open(args.log, "a") as f:
            f.write(json.dumps(record) + "\n")

    class Service(pb_grpc.EnvironmentServiceServicer):
        def __init__(self):
            self.lock = threading.Lock()
            self.episodes = {}
            self.steps = 0

        def Open(self, request, context):
            episode_id = uuid.uuid4().hex
            with self.lock:
                self.episodes[episode_id] = Episode(request.problem,
                                                    request.seed)
            return pb.OpenEpisodeResponse(episode_id=episode_id,
                                          tools=[pb.EnvTool(**CALC_TOOL)])

        def Step(self, request, context):
            with self.lock:
                self.steps += 1
                n = self.steps
                episode = self.episodes.get(request.episode_id)
            if n == args.exit_on_step:
                os._exit(1)  # killed: connections drop mid-call
            if episode is None:
                context.abort(grpc.StatusCode.NOT_FOUND,
                              f"no open episode '{request.episode_id}'")
            obs, reward = episode.step(request.turn, pb)
            if reward is not None:
                log(seed=episode.seed, reward=reward, how="done",
                    reason=0, cut_turn=False)
            return pb.StepEpisodeResponse(observation=obs)

        def Close(self, request, context):
            with self.lock:
                episode = self.episodes.pop(request.episode_id, None)
            if not request.truncated or episode is None:
                return pb.CloseEpisodeResponse()
            log(seed=episode.seed, reward=CUT, how="cut",
                reason=int(request.reason),
                cut_turn=request.HasField("cut_turn"))
            return pb.CloseEpisodeResponse(reward=CUT, correct=False)

    return Service()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--exit-on-step", type=int, default=0)
    parser.add_argument("--proto-dir",
                        default=os.path.join(HERE, "..", "proto"))
    args = parser.parse_args()
    pb, pb_grpc = load_stubs(os.path.abspath(args.proto_dir))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_EnvironmentServiceServicer_to_server(
        make_servicer(pb, pb_grpc, args), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    if port == 0:
        sys.exit(f"env_negative_server: cannot listen on port {args.port}")
    server.start()
    print(f"listening on {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
