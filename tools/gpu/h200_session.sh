#!/usr/bin/env bash
# The course's regular GPU measurements in one call on a bare H200 (no network): the ladder,
# the profiler, call times, the census and the GPU tests (`h200_call.sh` runs the steps).
#   COMMIT=$(git rev-parse --short HEAD) OUT=/tmp/out bash tools/gpu/h200_session.sh
STEPS="bench profile call_time census tests" exec bash "$(dirname "$0")/h200_call.sh"
