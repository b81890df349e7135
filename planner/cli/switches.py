"""The training job's on/off command-line switches (``planner.cli.common`` adds them to each
command that takes a job)."""

#: The job's on/off flags (``store_true``) and what each says.
JOB_SWITCHES: tuple[tuple[str, str], ...] = (
    ("--no-flash-attention", "attention saves its score matrix (no fused kernel)"),
    ("--no-overlap-grad-reduce",
     "gradients are reduced after the backward pass, not overlapped with it"),
    ("--no-overlap-p2p-communication",
     "Megatron-LM: interleaved pipelines wait for each send and receive (releases before "
     "October 2023)"),
    ("--tp-comm-overlap",
     "pipeline tensor-parallel collectives with the linear layers' matmuls: Megatron-LM's "
     "Transformer Engine userbuffers (sequence parallel rows), torchtitan's async TP"),
    ("--compile",
     "torchtitan: the model runs under torch.compile (fused memory-bound kernels; "
     "torchtitan's default is eager)"),
    ("--fused-cross-entropy",
     "the loss is a fused cross entropy on one fp32 copy of the logits (llm-foundry's "
     "default; Megatron-LM's --cross-entropy-loss-fusion, which NeMo and Megatron-Bridge "
     "turn on)"),
    ("--no-compile-loss",
     "torchtitan with --compile: the loss stays eager (torchtitan before April 2025); by "
     "default it is compiled with the model"),
    ("--no-grad-reduce-in-fp32",
     "Megatron: gradients kept and reduced in bf16 (NeMo's distributed_fused_adam with "
     "grad_sync_dtype bf16), not fp32 main_grad"),
    ("--fp8-param-gather",
     "fp8: parameters gathered in fp8: Megatron-LM's --fp8-param-gather (NeMo's fp8 recipes "
     "set it); torchtitan with the tensorwise recipe, FSDP's float8 all-gather "
     "(float8.enable_fsdp_float8_all_gather, as torchtitan's float8 docs launch it)"),
    ("--distribute-saved-activations",
     "full recompute without SP: each TP rank keeps a 1/tp slice of the saved layer input "
     "(Megatron-LM's --distribute-saved-activations)"),
    ("--zero3-synchronous-gather",
     "DeepSpeed v0.3.12-v0.5.4: ZeRO-3 gathers each parameter alone after a device "
     "synchronize, overlapping nothing"),
    ("--activation-func-fp8-input-store",
     "Megatron: a SwiGLU keeps its input in fp8 for backward (DeepSeek-V3's FP8 cache)"),
    ("--no-fp8-weight-transpose-cache",
     "Megatron-LM on AMD GPUs, fp8: Transformer Engine keeps each weight's fp8 copy but not "
     "its transpose (ROCm Megatron-LM's --no-fp8-weight-transpose-cache; Primus's "
     "no_fp8_weight_transpose_cache)"),
)
#: The switches that set the Job field of their own name.
SAME_NAMED = ("tp_comm_overlap", "compile", "fp8_param_gather", "distribute_saved_activations",
              "zero3_synchronous_gather", "activation_func_fp8_input_store")
