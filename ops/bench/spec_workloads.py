"""The speculative-decoding workload set: chats where the answer repeats the prompt, and one where it does not.

- `code_edit`: the prompt holds a Python function, the answer rewrites it with a small change;
- `quote`: the prompt holds a short document, the answer quotes or summarises it;
- `multi_turn`: a fixed context, earlier turns, and a question about it;
- `open_chat`: a question whose answer copies nothing (speculation must not cost here).

Each workload has 16 distinct conversations (as chat messages), so 16 concurrent requests differ.
Deterministic: no randomness, the same messages every run.
"""

from __future__ import annotations

FUNCTIONS = [
    (
        "moving_average",
        "values, window",
        [
            "if window <= 0:",
            '    raise ValueError("window must be positive")',
            "result = []",
            "total = 0.0",
            "for i, value in enumerate(values):",
            "    total += value",
            "    if i >= window:",
            "        total -= values[i - window]",
            "    if i >= window - 1:",
            "        result.append(total / window)",
            "return result",
        ],
    ),
    (
        "count_words",
        "text",
        [
            "counts = {}",
            "for word in text.lower().split():",
            '    word = word.strip(".,;:!?")',
            "    if not word:",
            "        continue",
            "    counts[word] = counts.get(word, 0) + 1",
            "return counts",
        ],
    ),
    (
        "merge_intervals",
        "intervals",
        [
            "intervals = sorted(intervals)",
            "merged = []",
            "for start, end in intervals:",
            "    if merged and start <= merged[-1][1]:",
            "        merged[-1][1] = max(merged[-1][1], end)",
            "    else:",
            "        merged.append([start, end])",
            "return merged",
        ],
    ),
    (
        "parse_config",
        "lines",
        [
            "config = {}",
            "for line in lines:",
            "    line = line.strip()",
            '    if not line or line.startswith("#"):',
            "        continue",
            '    key, _, value = line.partition("=")',
            "    config[key.strip()] = value.strip()",
            "return config",
        ],
    ),
]
EDITS = [
    "Rename the function {name} to {name}_v2.",
    "Add a docstring to the function {name}.",
    "Add type hints to the parameters of {name}.",
    "Rename the variable result to output in {name}, if it has one; otherwise add a comment on the first line.",
]

DOCUMENTS = [
    "The lighthouse on the northern cape was built in 1871 from granite quarried on the island. Its "
    "lamp was first lit with whale oil, then kerosene, and was electrified in 1923. The keeper's house "
    "beside it now holds a small museum with the original lens, which weighs nearly two tonnes and was "
    "made in Paris. Visitors can climb the 132 steps to the gallery on summer weekends.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. It happens in the "
    "chloroplasts of plant cells, where chlorophyll absorbs mostly red and blue light. The light "
    "reactions split water and store energy in ATP and NADPH; the Calvin cycle then uses that energy to "
    "fix carbon dioxide into sugars. Most of the oxygen in the air comes from this process.",
    "The city council approved the new bicycle plan on Tuesday. It adds forty kilometres of protected "
    "lanes over five years, starting with the river road and the market district. Parking on three "
    "streets will be removed, and the savings from fewer road repairs are expected to cover half of the "
    "cost. Construction of the first section begins in April.",
    "Sourdough bread rises with a starter: flour and water in which wild yeast and lactic acid bacteria "
    "live together. The bacteria give the bread its sour taste, the yeast its rise. A starter must be "
    "fed every day at room temperature, or every week in the fridge. A long, cool rise gives a more "
    "open crumb and a deeper flavour.",
]
QUOTE_ASKS = [
    "Repeat the text above word for word.",
    "Summarize the text above in two sentences.",
    "Quote the first two sentences of the text above exactly.",
    "Rewrite the text above as a bulleted list of its facts.",
]

OPEN_QUESTIONS = [
    "Write a short story about a dragon who is afraid of the dark.",
    "What are three good habits for staying healthy?",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me ideas for a birthday party for my grandmother.",
    "Describe your perfect weekend.",
    "What should I pack for a hiking trip in the mountains?",
    "Write a poem about the sea.",
    "How do I make friends in a new city?",
    "Tell me about the history of chess.",
    "What is a good way to learn a new language?",
    "Write a letter to a friend you have not seen in years.",
    "Why do cats purr?",
    "Invent a new board game and explain its rules.",
    "What makes a good teacher?",
    "Describe a futuristic city in the year 2200.",
    "How can I be more productive at work?",
]


def _code(name: str, params: str, body: list[str]) -> str:
    lines = [f"def {name}({params}):"] + ["    " + line for line in body]
    return "\n".join(lines) + "\n"


def code_edit() -> list[list[dict[str, str]]]:
    chats = []
    for edit in EDITS:
        for name, params, body in FUNCTIONS:
            ask = edit.format(name=name) + " Reply with the whole code only."
            content = f"{ask}\n\n```python\n{_code(name, params, body)}```"
            chats.append([{"role": "user", "content": content}])
    return chats


def quote() -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"{document}\n\n{ask}"}] for ask in QUOTE_ASKS for document in DOCUMENTS
    ]


def multi_turn() -> list[list[dict[str, str]]]:
    questions = [
        "What is the text about?",
        "Which numbers does it mention?",
        "Repeat its last sentence.",
        "Repeat the sentence that mentions a year or a day, word for word.",
    ]
    chats = []
    for document in DOCUMENTS:
        for i, question in enumerate(questions):
            chat = [{"role": "system", "content": "Answer using the context.\n\nContext: " + document}]
            chat += [
                {"role": "user", "content": "Summarize the context in one sentence."},
                {"role": "assistant", "content": document.split(". ")[0] + "."},
            ]
            if i:
                chat += [
                    {"role": "user", "content": questions[i - 1]},
                    {"role": "assistant", "content": document.split(". ")[min(i, 2)] + "."},
                ]
            chat.append({"role": "user", "content": question})
            chats.append(chat)
    return chats


def open_chat() -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": q}] for q in OPEN_QUESTIONS]


WORKLOADS = {"code_edit": code_edit, "quote": quote, "multi_turn": multi_turn, "open_chat": open_chat}
