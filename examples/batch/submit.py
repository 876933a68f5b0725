"""Run a file of tasks as one AgentGroup from a Ray job, with progress in the job's logs.

    ray job submit --working-dir examples/batch -- python submit.py tasks.jsonl
    ray job logs --follow <job id>          # "batch-...: 3/6 done (0 failed), 2 active, ..."

The driver runs on the cluster, so it reaches the nodus API there (``NODUS_API_URL``, by
default http://127.0.0.1:8000). Submitted again with the same ``--out``, it resumes: tasks
that finished are not run again. ``--out`` should be a path that outlives the job (the job's
working directory is deleted with it), such as shared storage.
"""

from __future__ import annotations

import argparse

import nodus
from nodus.batch import batch_group_name, log_progress, run_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", help="a .jsonl, .csv or .parquet file with key, input, depends_on")
    parser.add_argument("--agent", default="batch-worker")
    parser.add_argument("--out", default="/tmp/nodus-batch/answers.parquet")
    parser.add_argument("--max-active", type=int, default=4)
    parser.add_argument("--max-cost", default="1.00")
    args = parser.parse_args()

    # The agent the tasks run on: created on first use, the same one afterwards.
    agent = nodus.ClaudeAgent(
        args.agent, system="You answer in one short sentence.", families=["haiku"], per_run_max_cost="0.05"
    )
    agent.deploy()
    result = run_batch(
        args.tasks,
        agent=args.agent,
        out=args.out,
        max_active=args.max_active,
        max_cost=args.max_cost,
        on_progress=log_progress(batch_group_name(args.out), every=2.0),
    )
    print(
        f"{len(result.rows) - len(result.failed)} of {len(result.rows)} tasks succeeded; rows in {args.out}"
    )
    for row in result.rows:
        print(f"  {row['key']}: {row['phase']} {row.get('answer') or row.get('reason')}")


if __name__ == "__main__":
    main()
