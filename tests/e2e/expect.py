"""Checks one attnctl JSON response (stdin) against expectations (argv).

  attnctl ... | /usr/bin/python3 tests/e2e/expect.py output=2x3x4 weights=2x3x5

Expectations:
  NAME=DIMS     response field NAME is a tensor of shape DIMS whose elements
                are all there and finite (plain `values`, or attnctl's
                --summary form with count/min/max/mean)
  no:NAME       the response has no field NAME
  fit=EPOCHS    a FitBandwidth response: EPOCHS losses, all finite, and a
                finite bandwidth
  descends      (with fit=) each epoch's loss below the one before, and the
                final loss below the last: true of a small enough step only.
                The textbook's step (0.5 on the summed loss) overshoots on
                about 1 in 500 of attnctl's random data sets (seed 71199:
                32.9 -> 38.3), so e2e asks it of its small-step fit alone
Every response must name the implementation that ran (info.implementation).
Exit status 0 when all hold, 1 (with the reasons on stderr) otherwise.
Standard library only, so Debian's /usr/bin/python3 runs it.
"""

import json
import math
import sys


def finite(x):
    # protobuf's JSON mapping writes non-finite floats as strings.
    return isinstance(x, (int, float)) and math.isfinite(x)


def check_tensor(response, name, dims, errors):
    tensor = response.get(name)
    if not isinstance(tensor, dict):
        errors.append(f"{name}: missing")
        return
    # int64 shapes are JSON strings in protobuf's mapping; --summary prints ints.
    shape = [int(d) for d in tensor.get("shape", [])]
    if shape != dims:
        errors.append(f"{name}: shape {shape}, expected {dims}")
        return
    count = math.prod(dims)
    if "values" in tensor:
        values = tensor["values"]
        if len(values) != count:
            errors.append(f"{name}: {len(values)} values for {count} elements")
        bad = [v for v in values if not finite(v)]
        if bad:
            errors.append(f"{name}: non-finite values {bad[:5]}")
    elif "count" in tensor:
        if tensor["count"] != count:
            errors.append(f"{name}: count {tensor['count']}, expected {count}")
        for key in ("min", "max", "mean"):
            if not finite(tensor.get(key)):
                errors.append(f"{name}: {key} is {tensor.get(key)!r}")
    else:
        errors.append(f"{name}: neither values nor a summary: {tensor}")


def check_fit(response, epochs, errors):
    losses = response.get("loss_per_epoch", [])
    final = response.get("final_loss")
    if len(losses) != epochs:
        errors.append(f"loss_per_epoch: {len(losses)} losses, expected {epochs}")
    if not all(finite(x) for x in losses) or not finite(final):
        errors.append(f"non-finite loss: {losses} -> {final!r}")
    if not finite(response.get("bandwidth")):
        errors.append(f"bandwidth is {response.get('bandwidth')!r}")


def check_descent(response, errors):
    path = list(response.get("loss_per_epoch", [])) + [response.get("final_loss")]
    if not all(finite(x) for x in path):
        return  # check_fit says so
    if not path or any(not later < earlier
                       for earlier, later in zip(path, path[1:])):
        errors.append(f"the loss did not go down at every step: {path}")


def main(argv):
    text = sys.stdin.read()
    try:
        response = json.loads(text)
    except json.JSONDecodeError as e:
        print(f"expect.py: not JSON ({e}): {text[:200]!r}", file=sys.stderr)
        return 1
    errors = []
    if not response.get("info", {}).get("implementation"):
        errors.append("info.implementation is missing")
    for arg in argv:
        if arg.startswith("no:"):
            if arg[3:] in response:
                errors.append(f"{arg[3:]}: present, expected absent")
        elif arg.startswith("fit="):
            check_fit(response, int(arg[4:]), errors)
        elif arg == "descends":
            check_descent(response, errors)
        else:
            name, dims = arg.split("=", 1)
            check_tensor(response, name, [int(d) for d in dims.split("x")],
                         errors)
    for error in errors:
        print(f"expect.py: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
