"""Florence-2's task tokens and the prompts its processor puts in their place (HF's
`Florence2Processor`): a task without input must be the whole prompt; a task with input is
followed by it (`{input}`)."""

from __future__ import annotations

TASKS = {
    "<OCR>": "What is the text in the image?",
    "<OCR_WITH_REGION>": "What is the text in the image, with regions?",
    "<CAPTION>": "What does the image describe?",
    "<DETAILED_CAPTION>": "Describe in detail what is shown in the image.",
    "<MORE_DETAILED_CAPTION>": "Describe with a paragraph what is shown in the image.",
    "<OD>": "Locate the objects with category name in the image.",
    "<DENSE_REGION_CAPTION>": "Locate the objects in the image, with their descriptions.",
    "<REGION_PROPOSAL>": "Locate the region proposals in the image.",
}

TASKS_WITH_INPUT = {
    "<CAPTION_TO_PHRASE_GROUNDING>": "Locate the phrases in the caption: {input}",
    "<REFERRING_EXPRESSION_SEGMENTATION>": "Locate {input} in the image with mask",
    "<REGION_TO_SEGMENTATION>": "What is the polygon mask of region {input}",
    "<OPEN_VOCABULARY_DETECTION>": "Locate {input} in the image.",
    "<REGION_TO_CATEGORY>": "What is the region {input}?",
    "<REGION_TO_DESCRIPTION>": "What does the region {input} describe?",
    "<REGION_TO_OCR>": "What text is in the region {input}?",
}
