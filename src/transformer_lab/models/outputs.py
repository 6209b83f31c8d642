"""The one output type every model's forward returns, whatever the family: Hugging Face's
`ModelOutput` habit in miniature (named fields instead of tuples whose meaning differs per model).

Every model fills `logits`, its main head; the other fields are None where a model has no such
output. `attentions` is filled the same way everywhere: with `return_weights=True`, one tensor of
attention weights per layer, in layer order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """logits: the main head.
        JointIntentSlotModel, BertForJointIntentSlot: intent logits (batch, n_intents)
        BertForPreTraining: masked-LM logits (batch, length, vocab), or (n_positions, vocab) at mlm_positions
        BertForReplacedTokenDetection: the discriminator's replaced-token logit of every token (batch, length)
        BertForSequenceClassification, GPTForSequenceClassification, VisionTransformer,
        TabTransformer: class logits (batch, n_classes) (GPT multiple choice: (batch, n_choices))
        GPTLMHeadModel: next-token logits (batch, length, vocab)
        BertForQuestionAnswering: span logits (batch, length, 2), = start_logits and end_logits stacked
        Word2Vec: the score of every binary decision (batch, window or 1, decisions)
        ElmoBiLM: its representation, every layer's states (L + 1, batch, time, 2 * projection_dim):
            layer 0 the character encoder's (twice, to the width of [forward; backward]), then the biLSTM's
    loss: a loss the model computes itself (Word2Vec: -log p(centre | context) per example, (batch,);
        ElmoBiLM with word_ids: the mean of its forward_loss and backward_loss).
    aux_loss: a term the task adds to its loss with a weight: the mixture-of-experts load-balancing
        loss summed over layers (GPT with ffn=moe), else None.
    hidden_states: the last layer's states, (batch, tokens, d_model) (GPT classifier:
        (batch, n_sequences, length, d_model); BertForPreTraining at mlm_positions: only those,
        (n_positions, d_model)).
    attentions: with return_weights=True, one (batch, heads, queries, keys) tensor per layer
        (ViT window attention: per window, (batch * windows, heads, window², window²)).
    The other heads:
        slot_logits: one slot tag per token, (batch, length - 1, n_slots) after [CLS]
            (JointIntentSlotModel) or (batch, length, n_slots) over every token (BertForJointIntentSlot)
        start_logits, end_logits: (batch, length), the answer span's ends (BertForQuestionAnswering)
        nsp_logits: next-sentence logits (batch, 2) (BertForPreTraining)
        lm_logits: language-model logits over every input position (batch, n_sequences, length, vocab),
            for GPT-1's auxiliary LM loss (GPTForSequenceClassification)
        forward_loss, backward_loss: the mean next-word and previous-word losses (ElmoBiLM)
        generator_logits: the generator's masked-LM logits at the masked positions, (n_positions, vocab),
            and replaced: (batch, length) bool, which tokens its samples changed (BertForReplacedTokenDetection)
        encoder_hidden_states: the encoder's last states, (batch, source length, d_model)
            (TransformerSeq2Seq: the decoder's are in hidden_states, its self-attention in attentions)
        encoder_attentions, cross_attentions: with return_weights=True, one tensor per layer: the
            encoder's self-attention (batch, heads, source, source) and the decoder's attention over
            the source (batch, heads, target, source) (TransformerSeq2Seq)
    """

    logits: torch.Tensor
    loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    attentions: list[torch.Tensor] | None = None
    slot_logits: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    nsp_logits: torch.Tensor | None = None
    lm_logits: torch.Tensor | None = None
    forward_loss: torch.Tensor | None = None
    backward_loss: torch.Tensor | None = None
    generator_logits: torch.Tensor | None = None
    replaced: torch.Tensor | None = None
    encoder_hidden_states: torch.Tensor | None = None
    encoder_attentions: list[torch.Tensor] | None = None
    cross_attentions: list[torch.Tensor] | None = None
