"""The pure retrieval core (issue 4): BM25 (bm25.py; the analyzer is inference/text_analysis.py),
fusion, the outcome classification, the confidence gate, the recipe's numbers and the chunking
rule. No database, no gRPC, no broker; see docs/retrieval.md for the formulas and the rules.
Importers name the module that defines what they use."""
