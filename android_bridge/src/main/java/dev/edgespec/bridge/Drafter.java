package dev.edgespec.bridge;

/**
 * Proposes draft tokens; the app implements it (on a phone: a small model under ONNX Runtime
 * Mobile, see the README's recipe) or uses {@link PromptLookupDrafter}.
 *
 * <p>Order per generation: {@code begin(prompt)}, then per round {@code propose(k)} and
 * {@code commit(nAccepted, nextToken)}: the first {@code nAccepted} proposed tokens were kept
 * and {@code nextToken} is the target's own. After a fully accepted draft, a model drafter has
 * not yet seen its own last draft token: feed it before the next proposal. Roll a model's KV
 * cache back to an absolute length, never by slicing "the last n".
 */
public interface Drafter {
    void begin(int[] prompt, Sampling sampling);

    /** Up to {@code k} tokens (fewer or none is fine). */
    Draft propose(int k);

    void commit(int nAccepted, int nextToken);
}
