"""The techniques: each one module, ``<name>.py``, that owns what the technique is and what it does to a run.

A technique's module defines ``ENTRY``, its registry entry (``base.Technique``: name, summary, source, group,
conflicts and the reasons for them, requirements, the workloads it needs), whose ``hooks`` object
(``base.Hooks``) is called by every engine at fixed points: how it changes a real run (``attach``,
``init_context``, ``convert_module``, ``before_setup``, ``refusal``; the narrow protocols of ``base`` where it needs one), what
it observes for the Record (``observe``), its active check (``check``), what the case test
expects of it, and its replay on the sim (``sim_*``). The engines iterate over ``Recipe.hooks`` and never ask
which technique a recipe has. ``technique_registry.py`` is the list of entries, in the order case ids name them, and the
rules of combining them (``canonical``, the selections).

Where the line is drawn. Three kinds of choice stay **core fields of the recipe** (``Recipe.precision``,
``batch_size`` / ``accumulation_steps``, ``optimizer``, and the loop: ``stack``): their techniques
(``16-mixed``, ``bf16-true``, ..., ``small-batch``, ``grad-accum``, ``sgd``, ``adamw``, ``adam8bit``, ...,
``pytorch``, ``fabric``) are entries of ``technique_registry.py`` without a module. Every engine must make each of those
choices for every recipe (one precision, one batch, one optimizer, one loop), Lightning's own ``precision=``
and optimizer arguments are what they set, and a hook for each would only forward a value the engine needs
anyway; they are read as data, as Lightning's ``Fabric(precision=...)`` takes a string. A technique that
*changes* a run (wraps, converts, attaches, offloads, sets the allocator, observes something of its own) is a
module here, paged-adamw8bit included: its optimizer is the core field, its paging and what shows it are its
module's. So is the optimizer's implementation (``optimizer_impl.py``: ``for-loop``, ``foreach``, ``fused``): a core
field (``Recipe.optimizer_impl``, torch's ``foreach=``/``fused=``) every engine builds, whose module observes which
ran and the step's temporaries.

The training stacks that run the loop themselves are ``loop`` techniques with a module each, whose hooks are a
``base.Stack``: ``hf_trainer.py`` (transformers' Trainer), ``accelerate_loop.py`` (Accelerate with the course's loop),
``lightning_trainer.py`` (Lightning's Trainer). The recipe's core fields are what they express through the stack's own
switches (TrainingArguments, Accelerator's and Trainer's arguments: the module's mapping, plain data); what a stack
cannot express it refuses as a conflict with the reason; its driver (``memclaims.measure.stacks``, named by ``driver``) drives the probes
from the stack's callbacks; its ``loop_order`` is what the sim replays; its ``check`` reads what really ran.

The strategies are techniques too, whose hooks are a ``base.Strategy`` (Lightning's ``Strategy``, torchtitan's
``parallelize_fn``): ``fsdp.py`` (fsdp and FSDP1's sharding strategies; ``fsdp2.py`` asks the same ``Fsdp`` for
FSDP2), ``distributed_data_parallel.py``, ``deepspeed_zero2.py``. Each owns what a run on ranks refuses
(``rank_refusal``, per device), what its ranks execute (``plan``: a ``base.StrategyPlan``, plain data: FSDP's API,
sharding strategy, ``reshard_after_forward``, device mesh, wrap, checkpointing, offload, DDP's buckets, the notes
each engine writes), Lightning's own strategy object on the devices Lightning runs it on (``lightning_strategy``),
the plan as that Lightning object and its precision plugin configure it, for the engines that run the strategy where
Lightning does not (``configured``: FSDP's is what ``FSDPStrategy`` and ``FSDPPrecision`` would pass to FSDP), what
the CPU ranks' sharded engine calls where Lightning does not (``parallelize``, as ``ModelParallelStrategy``
calls its ``parallelize_fn``), what a rank's Record says ran (``rank_notes``, the plan's ``fsdp_api``), which of
the sim's replays runs a rank (``sim_replay``, its import path) and what that replay refuses (``sim_refusal``). The techniques
that combine with a strategy (activation-checkpointing, cpu-offload, delayed-init, init-module) change its plan
through their own ``plan_strategy``. The multi-rank engines (``memclaims.measure.distributed``,
``memclaims.measure.lightning_fsdp``, the sim's replays in ``memclaims.sim.replays``) execute the plan
(which FSDP API, which of the sim's replays) and ask ``Recipe.distributed`` only whether a recipe has a strategy,
never which technique it is.

What the reports read of a technique is its hooks' too: ``unsupported_on`` (requirements), ``load_only`` (fit's
time cost), ``stand_in`` and ``removes`` (the published series and the chain's floor). ``scripts/technique-flag-reads``
counts what still reads a technique's flag or name outside this package.

``impl/`` holds the torch code that hooks of several techniques share or that is large (peft's adapters on real
and fake tensors, the block checkpointing, FSDP2's ``fully_shard`` of each block for the CPU ranks and
``ModelParallelStrategy``, Lightning's FSDP configuration read and run by ``fully_shard`` on the CPU ranks,
save_on_cpu's offload, the per-parameter optimizers, the CUDA allocator setting); a technique may also keep its torch code in its own module
(``fused_linear_ce.py``), imported lazily.

May import ``core``: a technique module imports ``core`` and ``techniques.base`` at import time, torch, Lightning and ``impl/``
only inside its hooks (the registry loads before the pytest plugin's preflight has looked at the stack), and never
an engine (``measure``, ``sim``, ``run``): the claims import the registry and must reach no engine. The engines
import ``impl/`` and ``base`` (for the loop's helpers); recipes import the registry.
"""
