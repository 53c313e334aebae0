// Package answer checks model answers against gold answers: `\boxed{}` extraction (Boxed) and
// numeric / LaTeX equality for math (MathEqual, GSM8KGold; GSM8K, MATH), and the Search-R1 / SQuAD
// normalization and exact match for QA (NormalizeQA, ExactMatch).
package answer
