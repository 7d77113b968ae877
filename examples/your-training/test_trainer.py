"""The course's 8-bit Adam Trainer script on a small DistilBERT, with one callback line."""

import pytest
import torch
from torch import nn
from transformers import DistilBertConfig, DistilBertForSequenceClassification, Trainer, TrainingArguments
from transformers.trainer_pt_utils import get_parameter_names

from memclaims.watching import TrainerWatch

bnb = pytest.importorskip("bitsandbytes")


@pytest.mark.memclaims_budget("50 MB")
def test_course_trainer_memory(memclaims_watch, tmp_path):
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=1024, n_layers=2, n_heads=2, dim=64, hidden_dim=128,
                              max_position_embeddings=64, num_labels=2)
    model = DistilBertForSequenceClassification(config)
    rows = [{"input_ids": torch.randint(1, 1024, (64,)), "attention_mask": torch.ones(64, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(96)]
    training_args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=32, max_steps=3,
                                      use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no",
                                      disable_tqdm=True)

    decay_parameters = get_parameter_names(model, [nn.LayerNorm])
    decay_parameters = [name for name in decay_parameters if "bias" not in name]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if n in decay_parameters],
         "weight_decay": training_args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if n not in decay_parameters], "weight_decay": 0.0},
    ]
    optimizer_kwargs = {"betas": (training_args.adam_beta1, training_args.adam_beta2),
                        "eps": training_args.adam_epsilon, "lr": training_args.learning_rate}
    adam_bnb_optim = bnb.optim.Adam8bit(optimizer_grouped_parameters, **optimizer_kwargs)

    watched = TrainerWatch()  # the one added line, and callbacks=[watched]
    trainer = Trainer(model=model, args=training_args, train_dataset=rows, optimizers=(adam_bnb_optim, None),
                      callbacks=[watched])
    trainer.train()
    memclaims_watch.judge(watched.record)  # against the baseline stored for this test
