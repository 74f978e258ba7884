"""CoFED's tabular variant (the paper's Adult experiment shape): scikit-learn participants of four
kinds, a public set sampled from independent column marginals, a binary majority vote.
Cao et al., "CoFED: Cross-silo heterogeneous federated multi-task learning via co-training",
arXiv:2202.08603 (docs/algorithms.md section 3, "Tabular variant").
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import torch
from sklearn.base import ClassifierMixin, clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import SplineTransformer, StandardScaler
from sklearn.svm import SVC
from sklearn.tree import DecisionTreeClassifier
from torch import Tensor

from fedlightning.cofed.participant_base import Participant, Participants
from fedlightning.cofed.tasks import CoFEDData, ParticipantTask, Tasks
from fedlightning.data.sources import standardised
from fedlightning.errors import require
from fedlightning.seeding import derive_seed

TABULAR_SOURCES = ("breast_cancer", "synthetic", "adult")
ESTIMATORS = ("tree", "svm", "gam", "mlp")


class TabularTasks(Tasks):
    """Binary tabular tasks: every participant owns both classes and ``rows_per_participant`` rows.

    The source is split once into a stratified training pool and a test set (``test_fraction``,
    fixed ``random_state=0`` as for ``digits``, so every seed is scored on the same rows), then
    standardised with the pool's statistics. Each participant draws its rows from the pool without
    replacement; when the pool is too small for ``num_participants * rows_per_participant`` rows
    (breast cancer: 569 rows in all), every participant gets ``floor(pool / N)`` rows instead. All
    participants are scored on the whole test set (they all own both classes).

    Public set: ``public_size`` rows whose column j is drawn, independently of the other columns and
    with replacement, from the pooled values of column j over all participants' rows (the
    product of the marginals: no real row, and no joint structure, leaves a silo).

    Args:
        dataset: ``breast_cancer`` (scikit-learn's bundled Wisconsin data, 569 x 30),
            ``synthetic`` (``make_classification`` drawn from the seed) or ``adult`` (UCI Adult
            from ``root/adult.data`` and ``root/adult.test``, categorical columns one-hot:
            :func:`fedlightning.cofed.adult.load_adult`; the files' own train/test split is
            used and ``test_fraction`` is ignored; the paper: 100 participants x 200 rows).
        root: the folder holding ``adult.data`` and ``adult.test`` (``adult`` only).
        num_participants: number of participants N.
        rows_per_participant: training rows per participant (the paper's Adult setting: 200).
        test_fraction: share of the source held out as the test set, in (0, 1).
        public_size: number of public rows.
        num_samples, num_features: ``synthetic`` only.
    """

    def __init__(
        self,
        dataset: Literal["breast_cancer", "synthetic", "adult"] = "breast_cancer",
        num_participants: int = 8,
        rows_per_participant: int = 200,
        test_fraction: float = 0.25,
        public_size: int = 1000,
        num_samples: int = 4000,
        num_features: int = 20,
        root: str = "data/adult",
    ) -> None:
        require(
            dataset in TABULAR_SOURCES,
            "tasks.dataset",
            dataset,
            f"one of {', '.join(TABULAR_SOURCES)}",
        )
        require(
            num_participants >= 1, "tasks.num_participants", num_participants, "an integer >= 1"
        )
        require(
            rows_per_participant >= 2,
            "tasks.rows_per_participant",
            rows_per_participant,
            "an integer >= 2",
        )
        require(0 < test_fraction < 1, "tasks.test_fraction", test_fraction, "a number in (0, 1)")
        require(public_size >= 1, "tasks.public_size", public_size, "an integer >= 1")
        require(num_samples >= 20, "tasks.num_samples", num_samples, "an integer >= 20")
        require(num_features >= 2, "tasks.num_features", num_features, "an integer >= 2")
        self.dataset = dataset
        self.num_participants = num_participants
        self.rows_per_participant = rows_per_participant
        self.test_fraction = test_fraction
        self.public_size = public_size
        self.num_samples = num_samples
        self.num_features = num_features
        self.root = root

    def load(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        if self.dataset == "breast_cancer":
            from sklearn.datasets import load_breast_cancer

            bunch = load_breast_cancer()
            return bunch.data.astype(np.float32), bunch.target.astype(np.int64)
        from sklearn.datasets import make_classification

        x, y = make_classification(
            self.num_samples, self.num_features, n_informative=max(2, self.num_features // 2),
            random_state=derive_seed(seed, "synthetic") % 2**32,
        )  # fmt: skip
        return x.astype(np.float32), y.astype(np.int64)

    def rows(self, pool_size: int) -> int:
        """Rows per participant: ``min(rows_per_participant, floor(pool_size / N))``."""
        rows = min(self.rows_per_participant, pool_size // self.num_participants)
        require(
            rows >= 2, "tasks.num_participants", self.num_participants,
            f"at most {pool_size // 2} participants for the {pool_size} training rows (2 rows each)",
        )  # fmt: skip
        return rows

    def build(self, seed: int) -> CoFEDData:
        if self.dataset == "adult":
            from fedlightning.cofed.adult import load_adult

            train_x, train_y, test_x, test_y = load_adult(self.root)
        else:
            x, y = self.load(seed)
            train_x, test_x, train_y, test_y = train_test_split(
                x, y, test_size=self.test_fraction, stratify=y, random_state=0
            )
        split = standardised(train_x, train_y, test_x, test_y, num_classes=2)
        rng = np.random.default_rng(derive_seed(seed, "rows"))
        rows = self.rows(len(split.train_y))
        order = rng.permutation(len(split.train_y))[: rows * self.num_participants]
        parts = [np.sort(p) for p in np.split(order, self.num_participants)]
        space = np.array([0, 1])
        tasks = [
            ParticipantTask(
                space,
                split.train_x[p],
                split.train_y[p].numpy(),
                split.test_x,
                split.test_y.numpy(),
            )
            for p in parts
        ]
        pooled = split.train_x[np.concatenate(parts)]
        columns = rng.integers(0, len(pooled), size=(self.public_size, pooled.shape[1]))
        public_x = torch.gather(pooled, 0, torch.as_tensor(columns))
        partition = np.stack([np.bincount(t.train_y, minlength=2) for t in tasks])
        public_y = np.full(self.public_size, -1, dtype=np.int64)
        return CoFEDData(tasks, public_x, public_y, 2, ("0", "1"), partition)


class SklearnParticipants(Participants):
    """scikit-learn participants: participant i is an estimator of kind ``kinds[i mod len(kinds)]``.

    Kinds (inputs are flattened, so images work too):

    - ``tree``: ``DecisionTreeClassifier(max_depth=tree_max_depth)``;
    - ``svm``: standardise, ``SVC(kernel="rbf", C=svm_c)`` with Platt (sigmoid) probabilities fitted
      on 5-fold cross-validated decision values (``CalibratedClassifierCV(ensemble=False)``);
    - ``gam``: standardise, ``SplineTransformer(n_knots=gam_knots, degree=3)``, then
      ``LogisticRegression(C=gam_c)``: an additive model of cubic splines per feature with a logit
      link, the stand-in for a GAM;
    - ``mlp``: standardise, ``MLPClassifier(hidden_layer_sizes=mlp_hidden, max_iter=mlp_max_iter)``.

    Estimators cannot continue training, so update training refits a fresh clone on local plus
    pseudo-labelled rows (the paper's Adult procedure); rows are not reweighted.
    """

    def __init__(
        self,
        kinds: list[Literal["tree", "svm", "gam", "mlp"]] | None = None,
        tree_max_depth: int | None = 5,
        svm_c: float = 1.0,
        gam_knots: int = 5,
        gam_c: float = 1.0,
        mlp_hidden: list[int] | None = None,
        mlp_max_iter: int = 500,
    ) -> None:
        self.kinds = list(ESTIMATORS) if kinds is None else list(kinds)
        self.mlp_hidden = [32] if mlp_hidden is None else list(mlp_hidden)
        require(
            len(self.kinds) > 0 and all(k in ESTIMATORS for k in self.kinds),
            "participants.kinds", self.kinds, f"a non-empty list of {', '.join(ESTIMATORS)}",
        )  # fmt: skip
        require(
            tree_max_depth is None or tree_max_depth >= 1,
            "participants.tree_max_depth",
            tree_max_depth,
            "null or >= 1",
        )
        require(svm_c > 0, "participants.svm_c", svm_c, "a number > 0")
        require(gam_knots >= 2, "participants.gam_knots", gam_knots, "an integer >= 2")
        require(gam_c > 0, "participants.gam_c", gam_c, "a number > 0")
        require(
            all(h >= 1 for h in self.mlp_hidden),
            "participants.mlp_hidden",
            self.mlp_hidden,
            "sizes >= 1",
        )
        require(mlp_max_iter >= 1, "participants.mlp_max_iter", mlp_max_iter, "an integer >= 1")
        self.tree_max_depth = tree_max_depth
        self.svm_c = svm_c
        self.gam_knots = gam_knots
        self.gam_c = gam_c
        self.mlp_max_iter = mlp_max_iter

    def estimator(self, kind: str, random_state: int) -> ClassifierMixin:
        """A fresh, unfitted estimator of ``kind``."""
        if kind == "tree":
            return DecisionTreeClassifier(max_depth=self.tree_max_depth, random_state=random_state)
        if kind == "svm":
            svm = SVC(C=self.svm_c, kernel="rbf", random_state=random_state)
            return make_pipeline(
                StandardScaler(), CalibratedClassifierCV(svm, method="sigmoid", ensemble=False)
            )
        if kind == "gam":
            return make_pipeline(
                StandardScaler(), SplineTransformer(n_knots=self.gam_knots, degree=3),
                LogisticRegression(C=self.gam_c, max_iter=2000),
            )  # fmt: skip
        return make_pipeline(
            StandardScaler(),
            MLPClassifier(
                tuple(self.mlp_hidden), max_iter=self.mlp_max_iter, random_state=random_state
            ),
        )

    def build(
        self, index: int, num_classes: int, sample_shape: tuple[int, ...], seed: int
    ) -> Participant:
        kind = self.kinds[index % len(self.kinds)]
        return SklearnParticipant(
            self.estimator(kind, derive_seed(seed, kind) % 2**32), num_classes, kind
        )


class SklearnParticipant(Participant):
    """A scikit-learn estimator; probabilities are laid out over its whole label space (a class
    missing from its training rows gets probability 0)."""

    def __init__(self, estimator: ClassifierMixin, num_classes: int, description: str) -> None:
        self.template = estimator
        self.estimator = estimator
        self.num_classes = num_classes
        self.description = description

    def fit(self, x: Tensor, y: np.ndarray, seed: int) -> None:
        self.estimator = clone(self.template)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=ConvergenceWarning)
            self.estimator.fit(x.reshape(len(x), -1).numpy(), y)

    def update(self, x: Tensor, y: np.ndarray, seed: int) -> None:
        self.fit(x, y, seed)

    def predict_proba(self, x: Tensor) -> np.ndarray:
        probs = np.zeros((len(x), self.num_classes))
        probs[:, self.estimator.classes_] = self.estimator.predict_proba(
            x.reshape(len(x), -1).numpy()
        )
        return probs
