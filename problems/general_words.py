"""The fixed tables behind the tiny world's general tasks: words, facts, opposites, greetings."""

from __future__ import annotations


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


WORDS = _words(
    "apple river stone cloud house tiger music garden window pencil candle rocket forest "
    "silver winter bridge market planet dragon ladder bottle button castle mirror pocket "
    "rabbit tunnel violin wagon zebra anchor basket carpet dinner engine feather guitar "
    "hammer island jacket kettle magnet needle paper robot sugar table valley"
)
THINGS = {  # thing: (colour, category)
    "banana": ("yellow", "fruit"),
    "lemon": ("yellow", "fruit"),
    "cherry": ("red", "fruit"),
    "strawberry": ("red", "fruit"),
    "grape": ("purple", "fruit"),
    "lime": ("green", "fruit"),
    "carrot": ("orange", "vegetable"),
    "pea": ("green", "vegetable"),
    "pumpkin": ("orange", "vegetable"),
    "eggplant": ("purple", "vegetable"),
    "frog": ("green", "animal"),
    "crow": ("black", "animal"),
    "swan": ("white", "animal"),
    "flamingo": ("pink", "animal"),
    "bear": ("brown", "animal"),
    "milk": ("white", "drink"),
    "coffee": ("brown", "drink"),
    "cola": ("brown", "drink"),
}
_PAIRS = _words(
    "hot cold big small up down day night fast slow old new open closed light dark wet dry "
    "happy sad full empty early late hard soft loud quiet rich poor high low left right"
)
OPPOSITES = dict(zip(_PAIRS[::2], _PAIRS[1::2], strict=True)) | dict(
    zip(_PAIRS[1::2], _PAIRS[::2], strict=True)
)
NAMES = ("Tom", "Ana", "Raj", "Mia", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eva", "Ben", "Lily")
GREETINGS = {  # user says -> a polite reply
    "Hello, my name is {name}.": "Hello {name}, nice to meet you!",
    "Good morning! I am {name}.": "Good morning, {name}! How can I help you?",
    "Hi there, I am {name}. How are you?": "Hi {name}, I am well, thank you!",
    "Thank you for your help! I am {name}.": "You are welcome, {name}!",
}
FILLER = (
    "This is a simple request, but I want to be careful.",
    "Let me think about it from the beginning once more.",
    "There are many ways to look at a question like this.",
    "I hope this helps.",
    "Let me know if you would like anything else.",
    "It was a pleasure to think about this.",
)
