"""Print every published memory figure next to the estimator's prediction, and the errors.

    python benchmarks/memory_accuracy.py

Cases and sources: costmodel/data/memory_golden.toml.
"""

from __future__ import annotations

import statistics

from costmodel.fitting.validation import evaluate, memory_cases


def main() -> None:
    """Print the table and the mean / max absolute relative error."""
    errors = []
    print(f"{'case':<46s} {'published':>10s} {'predicted':>10s} {'error':>8s} {'tol':>6s}")
    for case in memory_cases():
        pred = evaluate(case)
        err = (pred - case.published) / case.published
        errors.append(abs(err))
        flag = "" if abs(err) <= case.tolerance else "  OUT OF TOLERANCE"
        print(f"{case.id:<46s} {case.published:>7.3f} {case.unit:<3s}{pred:>9.3f}  "
              f"{err:>+7.2%} {case.tolerance:>6.0%}{flag}")
    print(f"\n{len(errors)} cases: mean |error| {statistics.mean(errors):.2%}, "
          f"max |error| {max(errors):.2%}")


if __name__ == "__main__":
    main()
