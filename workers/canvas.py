"""The query canvas: flat, one chord for the two legs.

    chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)

The full-text leg does not wait for the embedding, and a batch that needs no
embedding (queries given with their vectors) leaves ``search.embed`` out, so
it never waits on the ``embed`` queue. A leg no query of the batch wants
(``Batch.legs``: the vector leg of a keyword batch, the full-text leg of a
semantic one) is left out too, and fusion records the missing leg as not
run, as the leg's own stage would have. With one leg there is nothing to
join: the canvas is one chain, the leg's stages then fusion's and those
after it, and ``search.fuse`` gets the leg's batch alone (the chord's
bookkeeping in the result backend cost a keyword query 2-3 ms through
Redis: BENCHMARKS.md, Latency floor). The order is the one ``pipeline.stages.registry``
declares (and ``run_local`` runs in-process, every leg).

Embedded (``task_always_eager``), ``run_eager`` runs the same canvas in this
process: each stage through Celery's own tracer, as ``Signature.apply`` runs
it, the tracer built once per task rather than once per call.

With ``expires`` (an ISO-8601 time, the query's deadline) every stage's
message carries it: a worker discards a stage it receives after then instead
of running it (Celery marks it revoked, acknowledges it, and the canvas stops
there), so a query its caller gave up on never runs later, audit row included.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4
from weakref import WeakKeyDictionary

from celery import Celery, Signature, chain, chord, group
from celery.utils.nodenames import gethostname

from pipeline.contracts import LEGS
from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, VECTOR_LEG

from .celery_compat import canvas_classes, eager_tracer
from .tasks import stage_task_id


def query_canvas(app: Celery, batch: dict, expires: str | None = None, canvas_id: str | None = None, *,
                 embed: bool = True, legs: tuple[str, ...] = LEGS):
    """The canvas for ``batch``; its last stage's task id is ``canvas_id`` (new
    by default) and every other stage's derives from it (``tasks.stage_task_id``),
    so a stage delivered again after its query was answered is not run again.
    ``embed=False`` (``Batch.needs_embedding`` false) leaves ``search.embed`` out;
    ``legs`` (``Batch.legs``) names the legs that run."""
    cid = canvas_id or str(uuid4())
    vector_leg = VECTOR_LEG if embed else VECTOR_LEG[1:]  # (search.embed, search.descend): descend alone

    def sig(name: str, *args):
        options = {"task_id": stage_task_id(cid, name)} | ({"expires": expires} if expires else {})
        return app.tasks[name].s(*args).set(**options)

    def steps(sigs: list):
        # in the shape ``chain(*sigs)`` folds to, built as it stands: no
        # signature cloned on the way (``_fold_chain`` clones each step but
        # the last, and merges the stages after fusion into the chord's body
        # one ``|`` at a time: ~0.2 ms of a query, ``ops.bench.latency``)
        return chain(sigs, app=app)

    def leg(names: tuple[str, ...]) -> list:
        first, *rest = names
        return [sig(first, batch)] + [sig(n) for n in rest]

    header = [leg(names) for name, names in (("vector", vector_leg), ("fts", FULLTEXT_LEG)) if name in legs]
    body = [sig(FUSION), *(sig(name) for name in AFTER_FUSION)]
    if len(header) == 1:  # chain(*leg, fuse, augment, scope, budget)
        return steps(header[0] + body)
    # chain(chord(group(*header), fuse), augment, scope, budget), as Celery folds it:
    # one chord whose body is the stages from fusion on
    return steps([chord(group(*(steps(sigs) if len(sigs) > 1 else sigs[0] for sigs in header)), steps(body))])


# Each app's tracers by task name: ``Task.apply`` builds one per call
# (``build_tracer``: closures, hooks and settings looked up), and
# ``chain.apply`` and ``chord.apply`` clone every signature on the way and wrap
# every result in an ``EagerResult``: the canvas's own time of an embedded
# keyword query (five stages), p50 1.03 -> 0.51 ms (``ops.bench.latency``).
_TRACERS: WeakKeyDictionary[Celery, dict[tuple[str, bool], Any]] = WeakKeyDictionary()
_trace_log = logging.getLogger("celery.app.trace")


def _tracer(app: Celery, name: str):
    # a tracer decides once whether to log each success (Celery's INFO line):
    # one per level, so a process whose logging changes logs as it is now
    key = (name, _trace_log.isEnabledFor(logging.INFO))
    tracers = _TRACERS.setdefault(app, {})
    tracer = tracers.get(key)
    if tracer is None:
        tracer = tracers[key] = eager_tracer(app, name)
    return tracer


def run_eager(app: Celery, sig: Any, previous: tuple = ()) -> Any:
    """Run ``sig`` (a chain, chord, group or task signature, nested as
    ``query_canvas`` builds them) in this process and return its last task's
    result, as ``sig.apply().get()`` would with ``task_eager_propagates``:
    a chain hands each result to the next task as its first argument, a
    chord's body gets the list of its header's results, and a task's
    exception is raised here. Each task runs through Celery's tracer (its
    request context, ``task_prerun`` / ``task_postrun`` signals and success
    log), with the request ``Task.apply`` gives it, and ``hand_on``: a stage
    returns its batch as it is (``tasks.HandedOn``), not as JSON."""
    chain_class, chord_class = canvas_classes()
    if isinstance(sig, chain_class):
        for step in sig.tasks:
            previous = (run_eager(app, step, previous),)
        return previous[0] if previous else None
    if isinstance(sig, chord_class):
        header = sig.tasks.tasks if isinstance(sig.tasks, group) else sig.tasks
        return run_eager(app, sig.body, ([run_eager(app, part, previous) for part in header],))
    if isinstance(sig, group):
        return [run_eager(app, part, previous) for part in sig.tasks]
    if not isinstance(sig, Signature):
        raise TypeError(f"not a canvas: {sig!r}")
    args = tuple(sig.args) if sig.immutable else previous + tuple(sig.args)
    task_id = sig.options.get("task_id") or str(uuid4())
    task = app.tasks[sig.task]
    request = {"id": task_id, "task": sig.task, "parent_id": None, "root_id": task_id, "retries": 0,
               "is_eager": True, "logfile": None, "loglevel": 0, "hostname": gethostname(),
               "callbacks": None, "errbacks": None, "headers": None, "timelimit": None,
               "ignore_result": sig.options.get("ignore_result", task.ignore_result),
               "delivery_info": {"is_eager": True, "exchange": None, "routing_key": None, "priority": None},
               "hand_on": True}
    return _tracer(app, sig.task)(task_id, args, dict(sig.kwargs), request).retval
