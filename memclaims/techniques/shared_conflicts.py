"""The conflicts several technique entries share, as plain data: the strategies' group (what the one-device techniques
name in their conflicts: ``Technique.conflict_with``), FSDP's shardings by name, and what every training stack
refuses, with the reasons. Names, not entries: a technique module cannot import the registry (the registry imports
it).
"""

from __future__ import annotations

# The sharded techniques besides the article's fsdp (FULL_SHARD), by name: FSDP1's other sharding
# strategies, and FSDP2 (fully_shard) with reshard_after_forward on and off.
FSDP1_SHARDINGS = ("fsdp-shard-grad-op", "fsdp-no-shard", "fsdp-hybrid")
FSDP2_TECHNIQUES = ("fsdp2", "fsdp2-no-reshard")
FSDP_SHARDINGS = (*FSDP1_SHARDINGS, *FSDP2_TECHNIQUES)
# The group of every multi-rank strategy technique (``Technique.group``): a conflict naming it is one with each of them,
# so a strategy added later conflicts with the one-device techniques without a list of names to extend.
STRATEGY = "strategy"

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
