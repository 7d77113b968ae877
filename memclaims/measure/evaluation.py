"""One evaluation as the course's Trainer logs it after each epoch: eval_loss, eval_accuracy, eval_f1.

The course's slide prints ``{'epoch': 1.0, 'eval_loss': 0.63, 'eval_accuracy': 0.67, 'eval_f1': 0.62}``
per epoch; a run asked for ``RunOptions.evaluate_each_epoch`` records the same three after every epoch
of its accuracy phase (``Record.epoch_evaluations``), read with torchmetrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F


@torch.no_grad()
def evaluate(logits_of: Callable[[object], torch.Tensor], batches: Iterable[tuple[object, torch.Tensor]],
             num_classes: int, device: torch.device) -> dict[str, float]:
    """Mean cross-entropy per example, accuracy and F1 over ``batches`` (the caller sets eval mode).

    F1: for two classes the positive class's (what scikit-learn's ``f1_score`` and ``evaluate``'s
    "f1" default to, the usual ``compute_metrics`` of a Trainer); macro over the classes otherwise.
    """
    import torchmetrics

    loss = torchmetrics.MeanMetric().to(device)
    accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=num_classes).to(device)
    f1: torchmetrics.Metric = (torchmetrics.F1Score(task="binary") if num_classes == 2 else
                               torchmetrics.F1Score(task="multiclass", num_classes=num_classes, average="macro"))
    f1 = f1.to(device)
    for inputs, targets in batches:
        logits = logits_of(inputs).float()  # the loss in fp32, as Trainer reports it under 16-bit precision
        # Weighted by the batch's examples: a short last batch counts per example, as Trainer's mean does.
        loss.update(F.cross_entropy(logits, targets), weight=targets.shape[0])
        predicted = torch.argmax(logits, 1)
        accuracy.update(predicted, targets)
        f1.update(predicted, targets)
    return {"eval_loss": float(loss.compute()), "eval_accuracy": float(accuracy.compute()),
            "eval_f1": float(f1.compute())}
