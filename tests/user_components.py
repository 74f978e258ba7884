"""Round components written from docs/algorithms.md section 6.2 as a user would (without
annotations), named by ``class_path`` in CLI runs (this folder is on ``sys.path`` under pytest)."""

import torch

from fedlightning.round_components import RoundComponent

#: what :class:`Probe` saw at each hook of the last run: ``(hook, round index, filled fields)``
SEEN: list[tuple[str, int, frozenset[str]]] = []
#: the uploads :class:`Probe` saw at ``on_results`` and at ``admits``, by round
UPLOADS: dict[tuple[str, int], list] = {}
ROUND_FIELDS = ("index", "last", "started", "client_ids", "payloads", "jobs", "results", "kept",
                "uploads", "aggregated")  # fmt: skip


def filled(round) -> frozenset[str]:
    """The fields of ``round`` that hold something (index, last and start time always do;
    ``aggregated`` once it is True)."""
    return frozenset(name for name in ROUND_FIELDS if _holds(round, name))


def _holds(round, name) -> bool:
    if name in ("index", "last", "started"):
        return True
    value = getattr(round, name)
    return value is True if isinstance(value, bool) else len(value) > 0


class Probe(RoundComponent):
    """Records which fields of the round each hook sees (in module globals: a test's record)."""

    def __init__(self):
        SEEN.clear()
        UPLOADS.clear()

    def _saw(self, hook, round):
        SEEN.append((hook, round.index, filled(round)))

    def on_round_start(self, round):
        self._saw("on_round_start", round)

    def select_clients(self, round, client_ids):
        self._saw("select_clients", round)
        return client_ids

    def configure_jobs(self, round, jobs):
        self._saw("configure_jobs", round)
        return jobs

    def on_results(self, round):
        self._saw("on_results", round)
        UPLOADS["on_results", round.index] = list(round.uploads)

    def transform_uploads(self, round, uploads):
        self._saw("transform_uploads", round)
        return uploads

    def admits(self, round):
        self._saw("admits", round)
        UPLOADS["admits", round.index] = list(round.uploads)
        return True

    def on_aggregating(self, round):
        self._saw("on_aggregating", round)

    def on_aggregated(self, round):
        self._saw("on_aggregated", round)

    def on_evaluated(self, round, row):
        self._saw("on_evaluated", round)
        return row

    def on_round_end(self, round):
        self._saw("on_round_end", round)


class UpdateNormMeter(RoundComponent):
    """update_norm: the mean L2 norm of the round's client updates (each upload minus the model
    its client received); update_norm_mean: its running mean over the rounds so far."""

    name = "update_norm"
    transient_attributes = frozenset({"norm"})  # this round's value: no later round reads it

    def __init__(self, prefix="update_norm"):
        self.prefix = prefix
        self.add_state("rounds", 0)
        self.add_state("mean", 0.0)
        self.norm = float("nan")

    def on_results(self, round):
        norms = []
        for upload in round.uploads:
            sent = round.payloads[upload.client_id].weights
            squares = [(w.double() - sent[k].double()).square().sum()
                       for k, w in upload.weights.items() if w.is_floating_point()]  # fmt: skip
            norms.append(float(torch.stack(squares).sum().sqrt()))
        self.norm = sum(norms) / len(norms) if norms else float("nan")
        if norms:
            self.rounds += 1
            self.mean += (self.norm - self.mean) / self.rounds

    def on_evaluated(self, round, row):
        return {**row, self.prefix: self.norm, f"{self.prefix}_mean": self.mean}


class Counter(RoundComponent):
    """Counts rounds in an undeclared attribute: refused at the end of the first round."""

    def __init__(self):
        self.count = 0

    def on_round_end(self, round):
        self.count += 1
