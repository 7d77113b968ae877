"""The conflicts several technique entries share, as plain data: the strategy techniques by name (what the one-device
techniques name in their conflicts) and what every training stack refuses, with the reasons. Names, not entries: a
technique module cannot import the registry (the registry imports it); ``suite/unit/techniques/test_technique_registry.py``
holds the strategies equal to the registry's ``strategy`` group.
"""

from __future__ import annotations

# The sharded techniques besides the article's fsdp (FULL_SHARD), by name: FSDP1's other sharding
# strategies, and FSDP2 (fully_shard) with reshard_after_forward on and off.
FSDP1_SHARDINGS = ("fsdp-shard-grad-op", "fsdp-no-shard", "fsdp-hybrid")
FSDP2_TECHNIQUES = ("fsdp2", "fsdp2-no-reshard")
FSDP_SHARDINGS = (*FSDP1_SHARDINGS, *FSDP2_TECHNIQUES)
# Every multi-rank strategy technique: what the one-device techniques name in their conflicts.
STRATEGIES = ("fsdp", *FSDP_SHARDINGS, "ddp", "deepspeed-zero2")

# What every stack refuses, and why (its entry's conflicts).
STACK_REFUSES_STRATEGIES = ("a strategy runs the recipe on several ranks through memclaims' rank engines (Fabric's "
                            "strategies, FSDP2 over gloo); the stack's own distributed launch is not driven by them")
STACK_REFUSES_FABRIC_HOOKS = {
    "init-module": "Fabric's init_module builds the model inside Fabric; the stack gets a model built before it",
    "delayed-init": "Fabric's init_module(empty_init=False) under FSDP, a strategy the stack does not run",
    "cpu-offload": "FSDP's CPUOffload, a strategy the stack does not run",
    "activation-offload": "save_on_cpu around each forward is a helper of memclaims' own loop, which the stack's "
                          "loop does not call",
    "optimizer-in-backward": "per-parameter optimizers stepped from post-accumulate-grad hooks replace the loop's own "
                             "optimizer step, which the stack runs itself",
    "lora": "peft's adapters: the stack would train peft's model, a workload memclaims does not build for it",
    "qlora": "peft's adapters on bitsandbytes' 4-bit weights: the stack would train peft's model, a workload "
             "memclaims does not build for it",
    "fused-linear-ce": "the chunked loss replaces the model's head inside memclaims' loss, which the stack does not call",
}
