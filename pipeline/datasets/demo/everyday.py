"""The everyday memories of both namespaces: deploys, reviews, runbooks, decisions; people, plans, meetings, chats."""

from __future__ import annotations

from datetime import timedelta

from pipeline.datasets.demo import tables as T
from pipeline.datasets.demo.world import World, cap, day, fill, wday, workday


def _build_deploys(w: World, n: int) -> None:
    combos = [(s, e) for s in range(len(T.SERVICES)) for e in range(len(T.DEPLOY_EXTRAS))]
    for si, ei in w.rng.sample(combos, n):
        service, major = T.SERVICES[si]
        extra, concepts = T.DEPLOY_EXTRAS[ei]
        env = w.rng.choice(T.DEPLOY_ENVS)
        slots = {"service": service, "version": w.version(major), "env": env, "Env": cap(env), "extra": extra}
        text, idents = fill(w.rng.choice(T.DEPLOY_TEMPLATES), slots)
        key = w.add("code", text, "text", w.at(), ("deploy",), concepts[:3], idents, "ci",
                    extra_meta={"service": service, "env": env})
        w.ident(slots["version"], "code", "version", key)


def build_code_everyday(w: World) -> None:
    _build_deploys(w, 40)
    for path, comment, topics, concepts in w.rng.sample(list(T.REVIEWS), len(T.REVIEWS)):
        slots = {"pr": w.pr(), "path": w.pick((path,)), "comment": comment}
        text, idents = fill(w.rng.choice(T.REVIEW_TEMPLATES), slots)
        key = w.add("code", text, "text", w.at(), topics, concepts, idents, "pr-review")
        w.ident(path, "code", "path", key)
    for path, snippet, topics, concepts in T.SNIPPETS:
        slots = {"path": w.pick((path,)), "snippet": snippet}
        text, idents = fill(w.rng.choice(T.SNIPPET_TEMPLATES), slots)
        key = w.add("code", text, "code", w.at(), topics, concepts, idents, "pr-review")
        w.ident(path, "code", "path", key)
    for cmd, topics, concepts, host in T.COMMANDS:
        slots = {"host": w.host(*host)} if host else {}
        cmd_text, idents = fill(cmd, slots)
        text = w.rng.choice(T.COMMAND_TEMPLATES).format(cmd=cmd_text)
        key = w.add("code", text, "code", w.at(), topics, concepts, idents, "runbook")
        for ident in idents:
            w.ident(ident, "code", "host", key)
    for d, topics, concepts in T.DECISIONS:
        text = w.rng.choice(T.DECISION_TEMPLATES).format(d=d)
        w.add("code", text, "decision", w.at(), topics, concepts, source="adr", grade=2)
    for f, topics, concepts in T.CONFIG_FACTS:
        text = w.rng.choice(T.CONFIG_TEMPLATES).format(f=f)
        w.add("code", text, "text", w.at(), topics, concepts, source="wiki")
    for note, topics, concepts in T.DEV_NOTES:
        when = w.at()
        eng, eng2 = w.rng.sample(T.ENGINEERS, 2)
        text = note.format(eng=eng, eng2=eng2, date=day(when + timedelta(days=w.rng.randint(3, 20))))
        w.add("code", text, "text", when, topics, concepts, source="slack")


def build_messages_everyday(w: World) -> None:
    for p, topics, concepts in T.PEOPLE:
        w.add("messages", w.rng.choice(T.PEOPLE_TEMPLATES).format(p=p), "note", w.at(), topics, concepts,
              source="notes")
    for p, topics, concepts in T.PREFERENCES:
        ctype = w.rng.choice(("note", "text"))
        w.add("messages", w.rng.choice(T.PREFERENCE_TEMPLATES).format(p=p), ctype, w.at(), topics, concepts,
              source="notes")
    for plan, topics, concepts in T.PLANS:
        when = w.at()
        text = plan.format(date=wday(when + timedelta(days=w.rng.randint(4, 45))), friend=w.rng.choice(T.FRIENDS))
        w.add("messages", text, "text", when, topics, concepts, source="assistant")
    for note, topics, concepts in T.TRAVEL:
        when = w.at()
        slots = {"date": wday(when + timedelta(days=w.rng.randint(10, 60))), "booking": w.booking()}
        text, idents = fill(note, slots)
        key = w.add("messages", text, "note", when, topics, concepts, idents, "email")
        w.ident(slots["booking"], "messages", "booking", key)
    combos = [(p, s) for p in range(len(T.MEETING_PEOPLE)) for s in range(len(T.MEETING_SUBJECTS))]
    for pi, si in w.rng.sample(combos, 40):
        when = w.at()
        subject, concepts = T.MEETING_SUBJECTS[si]
        who = T.MEETING_PEOPLE[pi]
        text = w.rng.choice(T.MEETING_TEMPLATES).format(
            who=who,
            Who=cap(who),
            subject=subject,
            date=wday(workday(when, w.rng.randint(1, 14))),
            time=w.rng.choice(T.MEETING_TIMES),
            place=w.rng.choice(T.MEETING_PLACES),
        )
        ctype = w.rng.choice(("text", "note"))
        w.add("messages", text, ctype, when, ("work",), ("meetings", *concepts), source="calendar")
    for chat, topics, concepts in T.CHATS:
        w.add("messages", chat, "chat", w.at(), topics, concepts, source="chat")
    for fact, topics, concepts in T.HOUSEHOLD:
        w.add("messages", fact, "note", w.at(), topics, concepts, source="notes")
