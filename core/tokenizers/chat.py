"""Chat templates (placeholder; the sandboxed renderer lands next)."""
MAX_RENDER_CHARS = 1_000_000
MAX_LOOP_STEPS = 1_000_000
RENDER_TIMEOUT_S = 5.0


def apply_chat_template(template, messages, *, add_generation_prompt=True, **extra):
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)
